"""`shamal distill`: train a smaller student of a sentence encoder against its teacher, as a job
on the scheduler (or in-process with ``--local``), gate it on fidelity and register it as a
variant of the teacher.

Registered in the root app as ``app.command("distill")(distill.distill)``, beside
``shamal optimize`` (whose ``SOURCE`` argument leaves no room for subcommands).
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from shamal.cli._common import JsonOption, client, console, err_console, escape, handle_errors
from shamal.cli._quantities import MEMORY_HELP, parse_duration_s, parse_memory_mib
from shamal.cli.job import parse_env
from shamal.errors import InvalidParameter

if TYPE_CHECKING:
    from shamal.optimize import DistillOutcome, DistillRequest

EXIT_BLOCKED = 2
#: The name the user's text has in the job's snapshot (its working folder).
DATA_NAME = "distill-data.txt"
_POLL_S = 1.0
_FINAL = ("succeeded", "failed", "cancelled", "lost")


def _keep(text: str | None) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        values = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise InvalidParameter("--keep takes comma-separated layer numbers, e.g. 0,2,4.") from None
    if not values or min(values) < 0 or max(values) > 255:
        raise InvalidParameter("--keep takes layer numbers from 0, e.g. 0,2,4.")
    return values


@dataclass(frozen=True)
class _Training:
    """The options that shape the student, as given (forwarded as they are to a job)."""

    layers: int
    keep: str | None
    epochs: int
    max_steps: int | None
    sentences: int
    batch_size: int
    learning_rate: float
    min_cosine: float
    timed: bool
    token_weight: float = 1.0
    min_cosine_mean: float = 0.99
    choose: str = "measured"

    def request(self, data: Path | None) -> DistillRequest:
        from shamal.optimize import DistillRequest, Thresholds

        made = DistillRequest(
            layers=self.layers,
            keep=_keep(self.keep),
            data=data,
            sentences=self.sentences,
            epochs=self.epochs,
            max_steps=self.max_steps,
            batch_size=self.batch_size,
            learning_rate=self.learning_rate,
            thresholds=Thresholds(min_cosine=self.min_cosine, min_cosine_mean=self.min_cosine_mean),
            timed=self.timed,
            token_weight=self.token_weight,
            choose=self.choose,
        )
        made.check()
        return made

    def argv(self) -> list[str]:
        args = ["--layers", str(self.layers), "--epochs", str(self.epochs)]
        args += ["--sentences", str(self.sentences), "--batch-size", str(self.batch_size)]
        args += ["--learning-rate", repr(self.learning_rate), "--min-cosine", repr(self.min_cosine)]
        args += ["--token-weight", repr(self.token_weight)]
        args += ["--min-cosine-mean", repr(self.min_cosine_mean)]
        args += ["--choose-layers", self.choose]
        args += ["--keep", self.keep] if self.keep else []
        args += ["--max-steps", str(self.max_steps)] if self.max_steps else []
        return args + ([] if self.timed else ["--no-time"])


@dataclass(frozen=True)
class _JobOptions:
    team: str | None
    cpus: float
    memory: str
    time_limit: str | None
    priority: str | None
    env: list[str]
    wait: bool


def _default_output(model_uri: str, variant: str) -> Path:
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", model_uri.removeprefix("models:/")).strip("-.")
    return Path("distilled") / f"{slug or 'model'}-{variant}"


def _check_name(register_as: str | None) -> None:
    if register_as is not None and (not register_as.strip() or register_as.startswith("-")):
        raise InvalidParameter("--register takes a model name (not empty, not starting with -).")


def _wait(api: Any, job: dict[str, Any]) -> dict[str, Any]:
    with console.status(f"job {job['id'][:12]} distills ..."):
        while job["state"] not in _FINAL:
            time.sleep(_POLL_S)  # the CLI's polling interval, not a synchronisation
            job = api.get_job(job["id"])
    return job


def _submit(
    model_uri: str,
    training: _Training,
    data: Path | None,
    registration: tuple[str | None, bool],
    options: _JobOptions,
    as_json: bool,
) -> None:
    """Queue the distillation as a job that runs ``shamal distill --local`` with the job's own
    token; the user's text travels as the job's snapshot."""
    from shamal.optimize import read_sentences

    register_as, no_register = registration
    training.request(data)  # refuse bad values and hostile text before anything is uploaded
    if data is not None:
        read_sentences(data)
    if not model_uri.startswith("models:/"):
        raise InvalidParameter(
            "A job distills a registered model (models:/NAME/VERSION); a local folder "
            "distills in-process with --local"
        )
    env = parse_env(options.env)
    memory_mib = parse_memory_mib(options.memory, "--memory")
    limit = parse_duration_s(options.time_limit, "--time-limit") if options.time_limit else None
    api = client()
    teacher = api.resolve_model_uri(model_uri)  # pinned: an alias moved later changes nothing
    command = ["python", "-m", "shamal", "distill", teacher.uri, "--local", *training.argv()]
    command += ["--output", "distilled", "--json"]
    command += ["--no-register"] if no_register else []
    command += ["--register", register_as] if register_as else []
    digest = None
    if data is not None:
        command += ["--data", DATA_NAME]
        with tempfile.TemporaryDirectory(prefix="shamal-distill-data-") as tmp:
            shutil.copyfile(data, Path(tmp) / DATA_NAME)
            digest = api.upload_snapshot(Path(tmp), options.team)
    job = api.submit_job(
        command,
        name=f"distill {teacher.name}/{teacher.version}"[:100],
        team=options.team,
        priority=options.priority,
        cpus=options.cpus,
        memory_mib=memory_mib,
        time_limit_s=limit,
        env=env,
        snapshot=digest,
    )
    if options.wait:
        job = _wait(api, job)
    if as_json:
        typer.echo(json.dumps(job))
    elif options.wait:
        console.print(f"distillation job [bold]{job['id']}[/] {job['state']}")
    else:
        console.print(f"queued distillation job [bold]{job['id']}[/] (shamal job logs -f ...)")
    if options.wait and job["state"] != "succeeded":
        raise typer.Exit(1)


def _summary(outcome: DistillOutcome) -> None:
    report = outcome.report
    variant = report.candidate
    f = variant.fidelity
    console.print(
        f"[bold]{variant.name}[/]: layers {','.join(map(str, report.keep))} of "
        f"{report.teacher_layers}, {len(report.losses)} steps on {escape(report.origin)}, "
        f"loss {report.losses[0]:.4f} -> {report.losses[-1]:.4f}"
        if report.losses
        else f"[bold]{variant.name}[/]: no training step"
    )
    if report.choice is not None:
        console.print(escape(report.choice.describe()))
    console.print(
        f"cosine to the teacher on {f.rows} held-out sentences: mean {f.cosine_mean:.4f}, "
        f"min {f.cosine_min:.4f}"
    )
    for v in report.report.variants:
        times = ", ".join(f"b{t.batch} t{t.threads} {t.p50_ms:.2f} ms" for t in v.timings)
        console.print(f"  {v.name}: {v.size_bytes / 1e6:.1f} MB{'; ' + times if times else ''}")
    if outcome.registered is not None:
        console.print(f"registered {outcome.registered.uri}")


def _run_local(
    model_uri: str,
    training: _Training,
    data: Path | None,
    registration: tuple[str | None, bool],
    output: Path | None,
    as_json: bool,
) -> None:
    from shamal.optimize import distill_model

    register_as, no_register = registration
    request = training.request(data)
    dest = (output or _default_output(model_uri, request.variant)).resolve()
    if dest.exists() and any(dest.iterdir()):
        raise InvalidParameter(f"{dest} is not empty; choose another --output.")
    status = contextlib.nullcontext() if as_json else console.status("distilling ...")
    with status:
        # A local teacher kept out of the registry needs no server (nothing is tracked).
        offline = not model_uri.startswith("models:/") and (no_register or not register_as)
        outcome = distill_model(
            None if offline else client(),
            model_uri,
            dest,
            request,
            register_as=register_as,
            register=not no_register,
        )
    registered = outcome.registered
    if as_json:
        body = {**outcome.report.to_json(), "run_id": outcome.run_id}
        body["registered"] = (
            {"name": registered.name, "version": registered.version} if registered else None
        )
        typer.echo(json.dumps(body))
    else:
        _summary(outcome)
    if outcome.report.candidate.fidelity.blocked:
        err_console.print(
            f"[red]{outcome.report.candidate.name} is BLOCKED[/]: "
            f"{outcome.report.candidate.fidelity.reason}; not registered."
        )
        raise typer.Exit(EXIT_BLOCKED)


@handle_errors
def distill(
    model_uri: Annotated[
        str,
        typer.Argument(
            help="The teacher: models:/NAME/VERSION (or @ALIAS, /latest) of a "
            "sentence-transformers / BERT-like encoder; with --local also a local folder."
        ),
    ],
    layers: Annotated[int, typer.Option(help="The student's layer count.")] = 3,
    keep: Annotated[
        str | None, typer.Option(help="The teacher's layers to keep instead, e.g. 0,2,4.")
    ] = None,
    choose_layers: Annotated[
        str,
        typer.Option(
            help="How --layers are chosen: measured (the subset that, untrained, stays closest "
            "to the teacher on the training text) or spread (evenly, first and last kept)."
        ),
    ] = "measured",
    data: Annotated[
        Path | None,
        typer.Option(help="Unlabeled text, one sentence a line (UTF-8); default: generated."),
    ] = None,
    sentences: Annotated[int, typer.Option(help="Generated sentences when no --data.")] = 2000,
    epochs: Annotated[int, typer.Option(help="Passes over the sentences.")] = 3,
    max_steps: Annotated[int | None, typer.Option(help="Stop after this many steps.")] = None,
    batch_size: Annotated[int, typer.Option(help="Sentences per step.")] = 32,
    learning_rate: Annotated[float, typer.Option(help="AdamW's peak learning rate.")] = 2e-4,
    min_cosine: Annotated[
        float, typer.Option(help="Block a student whose minimum cosine to the teacher is lower.")
    ] = 0.97,
    min_cosine_mean: Annotated[
        float, typer.Option(help="Block a student whose mean cosine to the teacher is lower.")
    ] = 0.99,
    token_weight: Annotated[
        float,
        typer.Option(help="Weight of the token-by-token hidden-state loss (0: embeddings only)."),
    ] = 1.0,
    time_it: Annotated[
        bool, typer.Option("--time/--no-time", help="Time the teacher and the student.")
    ] = True,
    register_as: Annotated[
        str | None,
        typer.Option(
            "--register",
            help="Register the student as a version of this model (default: the teacher's).",
        ),
    ] = None,  # fmt: skip
    no_register: Annotated[bool, typer.Option("--no-register", help="Do not register.")] = False,
    local: Annotated[
        bool, typer.Option("--local", help="Distill in this process instead of in a job.")
    ] = False,
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="With --local: folder for the student.")
    ] = None,
    team: Annotated[str | None, typer.Option(help="The team the job runs for.")] = None,
    cpus: Annotated[float, typer.Option(help="The job's CPUs.")] = 2.0,
    memory: Annotated[str, typer.Option(help=MEMORY_HELP)] = "4GiB",
    time_limit: Annotated[str | None, typer.Option(help="e.g. 2h; the job stops after it.")] = None,
    priority: Annotated[str | None, typer.Option(help="The job's priority class.")] = None,
    env: Annotated[
        list[str] | None, typer.Option("--env", "-e", help="KEY=VALUE for the job, repeatable.")
    ] = None,
    wait: Annotated[bool, typer.Option(help="Wait for the job and show its end.")] = False,
    as_json: bool = JsonOption,
) -> None:
    """Distill a sentence encoder into a student of fewer layers (initialised from the
    teacher's), trained on its outputs, gated on fidelity and registered as a variant.

    Example: shamal distill models:/minilm/1 --layers 3 --data sentences.txt --team nlp --wait
    """
    _check_name(register_as)
    training = _Training(
        layers,
        keep,
        epochs,
        max_steps,
        sentences,
        batch_size,
        learning_rate,
        min_cosine,
        time_it,
        token_weight,
        min_cosine_mean,
        choose_layers,
    )
    registration = (register_as, no_register)
    if local:
        _run_local(model_uri, training, data, registration, output, as_json)
        return
    options = _JobOptions(team, cpus, memory, time_limit, priority, env or [], wait)
    _submit(model_uri, training, data, registration, options, as_json)
