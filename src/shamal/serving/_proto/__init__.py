"""Generated Open Inference Protocol gRPC messages and stubs (see README.md to regenerate)."""
