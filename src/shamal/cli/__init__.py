"""The `shamal` command line: thin over the SDK client, one module per command group."""

from __future__ import annotations

from typing import Annotated

import typer

from shamal import __version__
from shamal.cli import (
    artifacts,
    audit,
    data,
    db,
    deploy,
    distill,
    job,
    optimize,
    scheduler,
    serve,
    sim,
    team,
    token,
    tracking,
    user,
)
from shamal.cli import events as events_cmd
from shamal.cli import features as features_cmd
from shamal.cli import lineage as lineage_cmd
from shamal.cli import monitor as monitor_cmd
from shamal.cli import pipeline as pipeline_cmd
from shamal.cli import tune as tune_cmd
from shamal.cli._common import ShamalGroup
from shamal.cli.server import server

__all__ = ["app", "main"]

app = typer.Typer(
    name="shamal",
    help="Shamal: a self-hostable ML platform. Start with `shamal server`; other commands "
    "talk to it at SHAMAL_URL (default http://127.0.0.1:8600) with the token in SHAMAL_TOKEN "
    "(default: the local admin token in ~/.shamal/token).",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    cls=ShamalGroup,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"shamal {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    """The group's help is the Typer(help=...) text above."""


app.command("server")(server)
app.add_typer(db.app, name="db")
app.add_typer(events_cmd.events_app, name="events")
app.add_typer(events_cmd.webhooks_app, name="webhooks")
app.add_typer(token.app, name="token")
app.add_typer(team.app, name="team")
app.add_typer(user.app, name="user")
app.add_typer(audit.app, name="audit")
app.add_typer(artifacts.app, name="artifacts")
app.add_typer(tracking.experiments, name="experiments")
app.add_typer(tracking.runs, name="runs")
app.add_typer(tracking.models, name="models")
app.add_typer(job.app, name="job")
app.add_typer(job.cost, name="cost")
app.add_typer(scheduler.app, name="scheduler")
app.command("tune", context_settings=tune_cmd.CONTEXT)(tune_cmd.tune)
app.add_typer(sim.app, name="sim")
app.command("optimize")(optimize.optimize)
app.command("distill")(distill.distill)
app.command("serve")(serve.serve)
app.command("deploy")(deploy.deploy)
app.add_typer(deploy.deployments, name="deployments")
app.add_typer(data.app, name="data")
app.command("lineage")(lineage_cmd.lineage)
app.add_typer(features_cmd.app, name="features")
app.add_typer(pipeline_cmd.app, name="pipeline")
app.add_typer(monitor_cmd.app, name="monitor")


def main() -> None:
    app()
