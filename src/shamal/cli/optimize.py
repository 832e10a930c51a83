"""`shamal optimize`: export a model to ONNX, quantize or prune it (structured or by
magnitude), check fidelity, measure latency, and register the variant as a new model version
linked to its source.

Registered in the root app as ``app.command("optimize")(optimize.optimize)``.
"""

from __future__ import annotations

import json
import re
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.cells import cell_len
from rich.console import RenderableType
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from shamal.cli._common import JsonOption, client, console, err_console, handle_errors
from shamal.cli._tables import table_width
from shamal.client import ShamalClient
from shamal.errors import InvalidParameter

if TYPE_CHECKING:
    from shamal.optimize import OptimizeReport, OptimizeRequest, VariantReport

EXIT_BLOCKED = 2


def _ints(text: str, option: str) -> tuple[int, ...]:
    try:
        values = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise InvalidParameter(f"{option} takes comma-separated numbers, e.g. 1,8,32.") from None
    if not values or min(values) < 1 or max(values) > 4096:
        raise InvalidParameter(f"{option} takes numbers between 1 and 4096.")
    return values


class _Bar:
    """A Rich progress bar as the optimizer's progress sink."""

    def __init__(self, progress: Progress) -> None:
        self._progress = progress
        self._task = progress.add_task("optimizing", total=None)

    def start(self, total: int) -> None:
        self._progress.update(self._task, total=total)

    def step(self, label: str) -> None:
        self._progress.update(self._task, advance=1, description=label)


def _fidelity_text(v: VariantReport) -> str:
    f = v.fidelity
    if f.metric == "unverified":
        return "unverified"
    text = f"{f.metric} {f.original:.4f} -> {f.variant:.4f}"
    if f.cosine_min is not None:
        text += f", cos min {f.cosine_min:.4f}"
    return f"{text}, max |diff| {f.max_abs_diff:.3g} ({f.rows} rows: {f.origin})"


def _verdict_text(v: VariantReport) -> str:
    parts = [f"[red]BLOCKED[/] {v.fidelity.reason}" if v.fidelity.blocked else "[green]OK[/]"]
    if v.note:
        parts.append(f"[dim]{v.note}[/]")
    return " ".join(parts)


def _table(report: OptimizeReport, batches: tuple[int, ...], threads: tuple[int, ...]) -> Table:
    table = Table(
        title=f"{report.source} ({report.kind}, {report.task})",
        title_justify="left",
        header_style="bold",
    )
    for column in ("variant", "threads", "size"):
        table.add_column(column, no_wrap=True)
    for batch in batches:
        table.add_column(f"b{batch} p50 ms", justify="right", no_wrap=True)
        table.add_column(f"b{batch} items/s", justify="right", no_wrap=True)
    table.add_column("fidelity", overflow="fold")
    table.add_column("verdict", overflow="fold")
    for v in report.variants:
        for count in threads:
            cells = _figures(v, count, batches)
            first = count == threads[0]
            cells += [_fidelity_text(v) if first else "", _verdict_text(v) if first else ""]
            table.add_row(*cells)
    return table


def _figures(v: VariantReport, count: int, batches: tuple[int, ...]) -> list[str]:
    """A variant's name, thread count, size and timings, as the full table's row shows them."""
    cells = [v.name, str(count), _size(v.size_bytes)]
    for batch in batches:
        t = v.timing(batch, count)
        cells += [f"{t.p50_ms:.2f}", f"{t.items_per_s:.0f}"] if t else ["-", "-"]
    return cells


def _size(size: int) -> str:
    return f"{size / 1e6:.1f} MB" if size >= 100_000 else f"{size / 1e3:.1f} kB"


def _default_output(model_uri: str) -> Path:
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", model_uri.removeprefix("models:/")).strip("-.")
    return Path("optimized") / (slug or "model")


TEXT_WIDTH = 24
"""The fewest columns the full table's fidelity and verdict may wrap in."""


def _report_tables(
    report: OptimizeReport, batches: tuple[int, ...], threads: tuple[int, ...], width: int
) -> list[RenderableType]:
    """The report as it fits a console ``width`` columns wide, with nothing cut with '…':
    the full table (:func:`_table`) when its names and figures fit whole with room for the
    fidelity and verdict to wrap in; otherwise a compact layout, one row per variant, thread
    count and batch (its columns do not multiply with the batches), and each variant's
    fidelity and verdict below as a line that wraps."""
    headers = ["variant", "threads", "size"]
    headers += [f"b{batch} {unit}" for batch in batches for unit in ("p50 ms", "items/s")]
    rows = [_figures(v, count, batches) for v in report.variants for count in threads]
    widths = [max(cell_len(cell) for cell in column) for column in zip(headers, *rows, strict=True)]
    if table_width([*widths, TEXT_WIDTH, TEXT_WIDTH]) <= width:
        return [_table(report, batches, threads)]
    return [_compact_table(report, batches, threads), *_verdict_lines(report)]


def _compact_table(
    report: OptimizeReport, batches: tuple[int, ...], threads: tuple[int, ...]
) -> Table:
    table = Table(
        title=f"{report.source} ({report.kind}, {report.task})",
        title_justify="left",
        header_style="bold",
    )
    table.add_column("variant", overflow="fold")
    table.add_column("size", no_wrap=True)
    for column in ("threads", "batch", "p50 ms", "items/s"):
        table.add_column(column, justify="right", no_wrap=True)
    for v in report.variants:
        for row, (count, batch) in enumerate((c, b) for c in threads for b in batches):
            t = v.timing(batch, count)
            figures = [f"{t.p50_ms:.2f}", f"{t.items_per_s:.0f}"] if t else ["-", "-"]
            named = [v.name, _size(v.size_bytes)] if row == 0 else ["", ""]
            table.add_row(*named, str(count), str(batch), *figures)
    return table


def _verdict_lines(report: OptimizeReport) -> list[str]:
    return [
        f"{escape(v.name)}: {_verdict_text(v)}; fidelity {escape(_fidelity_text(v))}"
        for v in report.variants
    ]


def _run(location: Path, dest: Path, request: OptimizeRequest, quiet: bool) -> OptimizeReport:
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err_console,
        transient=True,
        disable=quiet,
    ) as progress:
        from shamal.optimize import optimize_model

        return optimize_model(location, dest, request, progress=_Bar(progress))


def _register(
    api: ShamalClient | None,
    report: OptimizeReport,
    model_uri: str,
    register_as: str | None,
    source: Any,
) -> dict[str, Any] | None:
    name = register_as or (source.name if source is not None else None)
    if name is None or report.candidate.fidelity.blocked:
        return None
    from shamal.optimize import register_variant

    made = register_variant(
        api or client(),
        report,
        report.candidate,
        model_name=name,
        source_uri=source.uri if source is not None else model_uri,
        source=source,
    )
    return {"name": made.name, "version": made.version}


def _fetch(
    model_uri: str, merge: str | None, request: OptimizeRequest, tmp: Path, *, register: bool
) -> tuple[ShamalClient | None, Any, Path, OptimizeRequest]:
    """(client, source version, local model, request) with ``models:/`` sources downloaded
    into ``tmp``: the model, and the variant set to merge."""
    from shamal.optimize import fetch_source

    api, source, location = None, None, Path(model_uri)
    if model_uri.startswith("models:/"):
        api = client()
        source, location = fetch_source(api, model_uri, tmp)
        request = replace(request, source_uri=source.uri)
    elif register:
        request = replace(request, source_uri=model_uri)
    if merge is not None and merge.startswith("models:/"):
        api = api or client()
        _, merged = fetch_source(api, merge, tmp / "merge")
        request = replace(request, merge=merged)
    return api, source, location, request


def _print_choice(report: OptimizeReport) -> None:
    from rich.markup import escape

    for note in report.skipped:
        console.print(f"[dim]not built: {escape(note)}[/]")
    chosen = report.chosen
    if chosen is None:
        return
    cpu, name = escape(chosen.cpu.describe()), escape(chosen.winner.name)
    console.print(f"chosen for {cpu}: [bold]{name}[/]")
    console.print(f"  {escape(chosen.why)}")
    kept = f"; kept from --merge: {', '.join(chosen.kept)}" if chosen.kept else ""
    where = escape(f"{chosen.folder} (portable build: {chosen.portable}{kept})")
    console.print(f"  variant set: {where}")


@handle_errors
def optimize(
    model_uri: Annotated[
        str,
        typer.Argument(
            help="models:/NAME/VERSION (or @ALIAS, /latest), or a local MLflow sklearn folder, "
            "ONNX model folder/file, Hugging Face transformer folder, or torch model folder "
            "(with --torch-factory)."
        ),
    ],
    int8: Annotated[
        str | None, typer.Option("--int8", help="int8 quantization: dynamic or static.")
    ] = None,
    calibration: Annotated[
        Path | None,
        typer.Option(
            help="Calibration inputs for --int8 static and OpenVINO int8 (.npz/.npy/.csv); "
            "default: generated sentences for encoders, else the held-out inputs."
        ),
    ] = None,
    prune: Annotated[
        float | None,
        typer.Option(
            help="Magnitude-prune MatMul/Gemm/Conv weights to this sparsity (smaller when "
            "compressed; ONNX Runtime on CPU runs it no faster, and the report says so)."
        ),
    ] = None,
    prune_structured: Annotated[
        float | None,
        typer.Option(
            help="Remove this fraction of attention heads and feed-forward neurons "
            "(transformers) or of hidden units and conv channels (dense/conv layers): a "
            "smaller, faster model, fidelity-gated like every variant."
        ),
    ] = None,
    target: Annotated[str, typer.Option(help="cpu, or gpu for an fp16 variant.")] = "cpu",
    eval_data: Annotated[
        Path | None,
        typer.Option("--eval", help="Held-out inputs and labels y (.npz/.npy/.csv)."),
    ] = None,
    max_metric_drop: Annotated[
        float, typer.Option(help="Block a variant whose task metric drops more.")
    ] = 0.01,
    min_cosine: Annotated[
        float, typer.Option(help="Block a variant whose minimum output cosine is lower.")
    ] = 0.97,
    min_cosine_mean: Annotated[
        float, typer.Option(help="Block a variant whose mean output cosine is lower.")
    ] = 0.99,
    backend: Annotated[
        str,
        typer.Option(
            help="Runtime of the variant: onnxruntime, or openvino (f32, bf16 where the CPU has "
            "it, or int8 with --int8)."
        ),
    ] = "onnxruntime",
    choose: Annotated[
        bool,
        typer.Option(
            "--choose",
            help="Build every candidate (ONNX Runtime and OpenVINO int8, bf16/fp16 where "
            "native), time each on this CPU and keep the fastest that passes, as a variant set "
            "with a portable build.",
        ),
    ] = False,
    merge: Annotated[
        str | None,
        typer.Option(
            help="With --choose: a variant set (models:/NAME/VERSION or a folder) chosen on "
            "other kinds of CPU, whose builds the new set keeps beside this CPU's."
        ),
    ] = None,
    batch_sizes: Annotated[str, typer.Option(help="Batch sizes to time.")] = "1,8,32",
    threads: Annotated[str, typer.Option(help="Thread counts to time.")] = "1,2",
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Folder for the variants.")
    ] = None,
    register_as: Annotated[
        str | None, typer.Option(help="Register the variant as a version of this model.")
    ] = None,
    no_register: Annotated[bool, typer.Option("--no-register", help="Do not register.")] = False,
    trust_pickle: Annotated[
        bool, typer.Option(help="Load pickle-format models (they can run code; trust the author).")
    ] = False,
    torch_factory: Annotated[
        str | None,
        typer.Option(
            help="module:function (importable here) that builds the nn.Module of a torch model "
            "folder; its safetensors weights are loaded into it."
        ),
    ] = None,
    as_json: bool = JsonOption,
) -> None:
    """Optimize a model (ONNX, int8, pruning), check fidelity, time it, register the variant."""
    # The optimizer brings numpy and more: imported when a model is optimized, not for --help.
    from shamal.optimize import OptimizeRequest, Thresholds

    batches, counts = _ints(batch_sizes, "--batch-sizes"), _ints(threads, "--threads")
    dest = (output or _default_output(model_uri)).resolve()
    if dest.exists() and any(dest.iterdir()):
        raise InvalidParameter(f"{dest} is not empty; choose another --output.")
    request = OptimizeRequest(
        int8=int8,
        calibration=calibration,
        prune=prune,
        prune_structured=prune_structured,
        target=target,
        eval_data=eval_data,
        thresholds=Thresholds(max_metric_drop, min_cosine, min_cosine_mean),
        batches=batches,
        threads=counts,
        trust_pickle=trust_pickle,
        torch_factory=torch_factory,
        backend=backend,
        choose=choose,
        merge=Path(merge) if merge and not merge.startswith("models:/") else None,
    )
    if merge is not None and not choose:
        raise InvalidParameter("--merge adds to a variant set: it needs --choose.")
    request.check()
    with tempfile.TemporaryDirectory(prefix="shamal-optimize-") as tmp:
        api, source, location, request = _fetch(
            model_uri, merge, request, Path(tmp), register=bool(register_as and not no_register)
        )
        report = _run(location, dest, request, quiet=as_json)
    registered = None if no_register else _register(api, report, model_uri, register_as, source)
    if as_json:
        console.print_json(json.dumps({**report.to_json(), "registered": registered}))
    else:
        console.print(*_report_tables(report, batches, counts, console.width), sep="\n")
        _print_choice(report)
        if registered:
            console.print(f"registered models:/{registered['name']}/{registered['version']}")
    if report.candidate.fidelity.blocked:
        err_console.print(f"[red]{report.candidate.name} is BLOCKED[/]: not registered.")
        raise typer.Exit(EXIT_BLOCKED)
