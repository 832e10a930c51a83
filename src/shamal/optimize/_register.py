"""Registry glue: fetch a ``models:/`` source, register a variant as a linked new version.

A variant is registered through the MLflow-dialect API: a run (in the source version's
experiment when the source came from a run, else ``shamal-optimize``) holds the variant's
model folder under ``model/`` and its figures as params and metrics; the new version is created
from ``runs:/<run>/model`` with tags that link it to its source.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from shamal.client import ModelCalls, ModelRef
from shamal.optimize._report import OptimizeReport, VariantReport

__all__ = ["fetch_source", "register_variant", "variant_tags"]

logger = logging.getLogger(__name__)

FALLBACK_EXPERIMENT = "shamal-optimize"


def fetch_source(client: ModelCalls, uri: str, workdir: Path) -> tuple[ModelRef, Path]:
    """Resolve a ``models:/`` URI and download the version under ``workdir``.

    Returns:
        (the version, the folder holding its model).
    """
    ref = client.resolve_model_uri(uri)
    folder = client.download_model_version(ref.name, ref.version, workdir / "source")
    return ref, folder


def _figures(variant: VariantReport) -> dict[str, float]:
    f = variant.fidelity
    figures = {
        "fidelity_original": f.original,
        "fidelity_variant": f.variant,
        "fidelity_drop": f.drop,
        "max_abs_diff": f.max_abs_diff,
        "size_bytes": float(variant.size_bytes),
    }
    if f.cosine_mean is not None and f.cosine_min is not None:
        figures |= {"cosine_mean": f.cosine_mean, "cosine_min": f.cosine_min}
    for t in variant.timings:
        figures[f"p50_ms_b{t.batch}_t{t.threads}"] = t.p50_ms
        figures[f"items_per_s_b{t.batch}_t{t.threads}"] = t.items_per_s
    return figures


def variant_tags(
    report: OptimizeReport, variant: VariantReport, source_uri: str, source: ModelRef | None
) -> dict[str, str]:
    """The tags that link a registered variant to its source and carry its figures."""
    f = variant.fidelity
    tags = {
        "shamal.source_model_uri": source_uri,
        "shamal.variant": variant.name,
        "shamal.task": report.task,
        "shamal.fidelity.metric": f.metric,
        "shamal.fidelity.original": f"{f.original:.6f}",
        "shamal.fidelity.variant": f"{f.variant:.6f}",
        "shamal.fidelity.max_abs_diff": f"{f.max_abs_diff:.6g}",
        "shamal.fidelity.rows": str(f.rows),
        "shamal.fidelity.inputs": f.origin,
        "shamal.size_bytes": str(variant.size_bytes),
    }
    if source is not None:
        tags["shamal.source_version"] = str(source.version)
    if f.cosine_min is not None:
        tags["shamal.fidelity.cosine_min"] = f"{f.cosine_min:.6f}"
    for t in variant.timings:
        tags[f"shamal.latency.p50_ms.b{t.batch}.t{t.threads}"] = f"{t.p50_ms:.3f}"
    if report.chosen is not None:
        cpu = report.chosen.cpu
        tags |= {
            "shamal.cpu.model": cpu.model,
            "shamal.cpu.kind": cpu.kind,
            "shamal.cpu.isa": ",".join(sorted(cpu.isa)),
            "shamal.variant_set.kinds": ",".join((cpu.kind, *report.chosen.kept)),
            "shamal.variant_set.portable": report.chosen.portable,
            "shamal.choice": report.chosen.why[:500],
        }
    return tags


def register_variant(
    client: ModelCalls,
    report: OptimizeReport,
    variant: VariantReport,
    *,
    model_name: str,
    source_uri: str,
    source: ModelRef | None,
) -> ModelRef:
    """Log the variant in a run and register it as a new version of ``model_name`` (created
    when missing). Blocked variants are never registered (the caller checks the verdict)."""
    tags = variant_tags(report, variant, source_uri, source)
    experiment = client.experiment_for_variants(
        source.run_id if source else None, FALLBACK_EXPERIMENT
    )
    run_id = client.create_run(experiment, f"optimize-{variant.name}", tags)
    try:
        client.log_run_values(
            run_id,
            {"variant": variant.name, "source_model_uri": source_uri[:500]},
            _figures(variant),
            int(time.time() * 1000),
        )
        model_uri = client.upload_run_folder(run_id, variant.folder, "model")
    except BaseException:
        client.finish_run(run_id, "FAILED")
        raise
    client.finish_run(run_id)
    client.ensure_registered_model(model_name)
    fidelity = variant.fidelity
    description = f"{variant.name} of {source_uri} ({fidelity.metric} {fidelity.variant:.4f})"
    return client.create_model_version(model_name, model_uri, run_id, tags, description)
