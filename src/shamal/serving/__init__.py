"""Model serving: an Open Inference Protocol server (REST + gRPC) with dynamic batching.

Run it with ``shamal serve``. The pieces: model files checked
without trusting them (:mod:`._modelfiles`), runtimes behind one interface (:mod:`._backends`), the
repository of loaded versions (:mod:`._repository`), per-version dynamic batching
(:mod:`._batching`), the protocol-independent inference core (:mod:`._core`), the REST front end
(:mod:`._rest`, :mod:`._rest_codec`), metrics (:mod:`._metrics`) and the process (:mod:`._server`).
"""
