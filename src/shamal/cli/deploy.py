"""`shamal deploy` and `shamal deployments`: put model versions behind an endpoint, roll out safely.

`shamal deploy NAME --model models:/m@champion` creates the deployment (or replaces its spec);
`--canary URI --percent 10 --steps 10,25,50,100 --interval 60s` starts a canary that the control
plane's rollout controller moves up step by step, or rolls back when it breaks the SLO.
"""

from __future__ import annotations

import csv
import io
import json
from typing import Annotated, Any

import typer

from shamal.cli._common import JsonOption, client, console, escape, handle_errors, print_table
from shamal.cli._quantities import parse_duration_s, require_finite
from shamal.errors import InvalidParameter

deployments = typer.Typer(
    help="Deployments: list, show, promote or roll back a canary, delete, samples, labels.",
    no_args_is_help=True,
)


def parse_weights(text: str) -> list[dict[str, Any]]:
    """'models:/m/1=70,models:/m/2=30' -> [{model, weight}, ...]."""
    out = []
    for item in (part.strip() for part in text.split(",")):
        uri, sep, weight = item.rpartition("=")
        if not sep or not uri or not weight.strip().isdigit():
            raise InvalidParameter(f"--weights takes URI=WEIGHT,URI=WEIGHT, not {item!r}")
        out.append({"model": uri, "weight": int(weight)})
    return out


def parse_shadow(text: str) -> dict[str, Any]:
    """'models:/m/3' (mirror every request) or 'models:/m/3=25' (a quarter of them)."""
    uri, sep, percent = text.rpartition("=")
    if sep and percent.strip().isdigit():
        return {"model": uri, "percent": int(percent)}
    return {"model": text, "percent": 100}


def parse_steps(text: str) -> list[int]:
    try:
        return [int(step) for step in text.split(",")]
    except ValueError:
        raise InvalidParameter(
            f"--steps takes percentages such as 10,25,50,100, not {text!r}"
        ) from None


def _print_deployment(d: dict[str, Any], events: list[dict[str, Any]] | None = None) -> None:
    state = d["state"]
    console.print(
        f"[bold]{d['name']}[/] (team {d['team'] or '-'}) revision {d['revision']}  "
        f"[bold]{state['phase']}[/]"
        + (f" canary at {state['canary_weight']}%" if state["phase"] == "progressing" else "")
    )
    routes = [
        {
            **r,
            "traffic": f"{r['share']:.1%}" + (" mirrored" if r["role"] == "shadow" else ""),
        }
        for r in d["routes"]
    ]
    print_table(
        "Routes",
        ["role", "model", "version", "weight", "traffic", "uri"],
        routes,
        rank=["model", "version", "traffic"],
    )
    slo, plan = d["slo"], d["rollout"]
    console.print(
        f"SLO: errors <= {slo['max_error_rate']:.2%}, p99 <= {slo['max_p99_ms']:g} ms, "
        f"judged after {slo['min_requests']} requests; rollout steps "
        f"{', '.join(str(s) for s in plan['steps'])}% every {plan['interval_s']:g} s; "
        f"sticky header {d['sticky_header']}; sample rate {d['sample_rate']:g}"
    )
    if d.get("feature_service"):
        console.print(
            f"Feature service {escape(d['feature_service'])}: callers send its entity keys"
        )
    if events:
        rows = [{**e, "reason": e["reason"][:80]} for e in events]
        print_table("Recent events", ["at", "revision", "kind", "actor", "reason"], rows)


@handle_errors
def deploy(
    name: Annotated[str, typer.Argument(help="The deployment (the endpoint's name).")],
    model: Annotated[
        str | None, typer.Option("--model", help="The primary: models:/m@alias or models:/m/3.")
    ] = None,
    weights: Annotated[
        str | None,
        typer.Option("--weights", help="A/B primaries: models:/m/1=70,models:/m/2=30."),
    ] = None,
    canary: Annotated[str | None, typer.Option("--canary", help="A canary version URI.")] = None,
    percent: Annotated[
        int, typer.Option("--percent", help="The canary's first share (percent).")
    ] = 10,
    steps: Annotated[
        str, typer.Option("--steps", help="Canary percentages to pass through.")
    ] = "10,25,50,100",
    interval: Annotated[
        str, typer.Option("--interval", help="Healthy time at each step, e.g. 60s, 5m.")
    ] = "60s",
    shadow: Annotated[
        list[str] | None,
        typer.Option("--shadow", help="A shadow URI (=PERCENT to mirror a share); repeatable."),
    ] = None,
    sticky_header: Annotated[
        str,
        typer.Option("--sticky-header", help="Header whose value keeps a caller on one version."),
    ] = "x-shamal-route-key",
    slo_error_rate: Annotated[
        float, typer.Option("--slo-error-rate", help="Highest error rate a canary may show.")
    ] = 0.01,
    slo_p99_ms: Annotated[
        float, typer.Option("--slo-p99-ms", help="Highest p99 latency (ms) a canary may show.")
    ] = 1000.0,
    slo_min_requests: Annotated[
        int, typer.Option("--slo-min-requests", help="Requests a window needs before judging.")
    ] = 100,
    sample_rate: Annotated[
        float, typer.Option("--sample-rate", help="Fraction of requests logged for monitoring.")
    ] = 0.01,
    team: Annotated[str | None, typer.Option("--team", help="The owning team.")] = None,
    feature_service: Annotated[
        str | None,
        typer.Option(
            "--feature-service",
            help="A feature service: callers send its entity keys, the model server reads "
            "their online features.",
        ),
    ] = None,
    as_json: bool = JsonOption,
) -> None:
    """Deploy model versions behind NAME (create it, or replace its spec).

    Example: shamal deploy fraud --model models:/fraud@champion --canary models:/fraud/4
    --percent 10 --steps 10,25,50,100 --interval 5m --slo-error-rate 0.01 --slo-p99-ms 50
    """
    if (model is None) == (weights is None):
        raise InvalidParameter("give the primary with --model, or A/B primaries with --weights")
    require_finite(
        {
            "--slo-error-rate": slo_error_rate,
            "--slo-p99-ms": slo_p99_ms,
            "--sample-rate": sample_rate,
        }
    )
    primary = parse_weights(weights) if weights else [{"model": model, "weight": 100}]
    spec: dict[str, Any] = {
        "primary": primary,
        "shadows": [parse_shadow(s) for s in shadow or ()],
        "rollout": {
            "steps": parse_steps(steps),
            "interval_s": parse_duration_s(interval, "--interval"),
        },
        "slo": {
            "max_error_rate": slo_error_rate,
            "max_p99_ms": slo_p99_ms,
            "min_requests": slo_min_requests,
        },
        "sticky_header": sticky_header,
        "sample_rate": sample_rate,
    }
    if canary is not None:
        spec["canary"] = {"model": canary, "percent": percent}
    if team is not None:
        spec["team"] = team
    if feature_service is not None:
        spec["feature_service"] = feature_service
    deployed = client().deploy(name, spec)
    if as_json:
        console.print_json(data=deployed)
        return
    _print_deployment(deployed)


@deployments.command("list")
@handle_errors
def list_deployments(as_json: bool = JsonOption) -> None:
    """Deployments you can see."""
    found = client().list_deployments()
    rows = [
        {
            "name": d["name"],
            "team": d["team"],
            "revision": d["revision"],
            "phase": d["state"]["phase"],
            "routes": ", ".join(
                f"{r['role']} v{r['version']} {r['share']:.0%}" for r in d["routes"]
            ),
        }
        for d in found
    ]
    if as_json:
        console.print_json(data=found)
        return
    print_table("Deployments", ["name", "team", "revision", "phase", "routes"], rows)


@deployments.command("show")
@handle_errors
def show(
    name: str,
    events: Annotated[int, typer.Option("--events", min=1, max=1000)] = 10,
    as_json: bool = JsonOption,
) -> None:
    """A deployment's routes, weights, rollout state and recent events."""
    api = client()
    found = api.get_deployment(name)
    recent = api.deployment_events(name, limit=events)
    if as_json:
        console.print_json(data={**found, "events": recent})
        return
    _print_deployment(found, recent)


@deployments.command("promote")
@handle_errors
def promote(
    name: str,
    revision: Annotated[
        int | None, typer.Option("--revision", help="Only if still at this revision.")
    ] = None,
    as_json: bool = JsonOption,
) -> None:
    """Make the canary the primary now."""
    done = client().promote_deployment(name, revision=revision)
    if as_json:
        console.print_json(data=done)
        return
    console.print(f"promoted: {name} is at revision {done['revision']}")


@deployments.command("rollback")
@handle_errors
def rollback(
    name: str,
    reason: Annotated[str, typer.Option("--reason")] = "",
    revision: Annotated[
        int | None, typer.Option("--revision", help="Only if still at this revision.")
    ] = None,
    as_json: bool = JsonOption,
) -> None:
    """Remove the canary now; its traffic goes back to the primaries."""
    done = client().rollback_deployment(name, reason=reason, revision=revision)
    if as_json:
        console.print_json(data=done)
        return
    console.print(f"rolled back: {name} is at revision {done['revision']}")


@deployments.command("token")
@handle_errors
def token(
    name: Annotated[str, typer.Argument(help="The deployment whose models the token may call.")],
    label: Annotated[str, typer.Option("--name", help="What the token is for.")] = "caller",
    expires: Annotated[
        str, typer.Option("--expires", help="Lifetime: 30m, 12h, 90d, or never.")
    ] = "90d",
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Print only the secret.")] = False,
) -> None:
    """Issue a token that may call NAME's models through `shamal serve --deployment NAME`
    and nothing else: what to hand the deployment's callers. Printed once."""
    seconds = None if expires == "never" else int(parse_duration_s(expires, "--expires"))
    issued = client().create_deployment_token(name, label, expires_in_s=seconds)
    if quiet:
        typer.echo(issued["secret"])
        return
    console.print(
        f"[green]token {escape(issued['name'])}[/] may call deployment {escape(name)} only "
        f"(expires {issued['expires_at'] or 'never'})"
    )
    console.print(f"[bold]{issued['secret']}[/]")
    console.print("[dim]This is the only time the secret is shown.[/]")


@deployments.command("delete")
@handle_errors
def delete(name: str) -> None:
    """Delete a deployment (maintainer). Serve processes keep their last spec until stopped."""
    client().delete_deployment(name)
    console.print(f"deleted deployment {name}")


@deployments.command("samples")
@handle_errors
def samples(
    name: str,
    limit: Annotated[int, typer.Option("--max", min=1, max=1000)] = 20,
    as_json: bool = JsonOption,
) -> None:
    """The newest sampled requests (inputs and outputs, excerpts)."""
    found = client().deployment_samples(name, limit=limit)
    if as_json:
        console.print_json(data=found)
        return
    rows = [
        {
            "at": s["at"],
            "version": s["version"] + (" (shadow)" if s["shadow"] else ""),
            "request id": s.get("request_id") or "",
            "inputs": json.dumps(s["inputs"])[:60],
            "outputs": json.dumps(s["outputs"])[:60],
            "label": "" if s.get("label") is None else json.dumps(s["label"])[:30],
        }
        for s in found
    ]
    print_table("Samples", ["at", "version", "request id", "inputs", "outputs", "label"], rows)


@deployments.command("labels")
@handle_errors
def labels(
    name: str,
    source: Annotated[
        typer.FileText,
        typer.Argument(
            help="CSV with columns request_id,label, or JSON lines of "
            '{"request_id": ..., "label": ...}; - reads standard input.'
        ),
    ],
    as_json: bool = JsonOption,
) -> None:
    """Post the true outcomes of served requests, by the request ids their callers sent.

    The monitor joins them to the sampled requests to measure the model's performance. A label
    posted again for a request replaces the first.
    """
    found = read_labels(source.read())
    outcome = client().post_deployment_labels(name, found)
    if as_json:
        console.print_json(data=outcome)
        return
    unmatched = outcome["unmatched"]
    console.print(f"stored {outcome['stored']} labels for {escape(name)}")
    if unmatched:
        console.print(
            f"[yellow]{len(unmatched)} labels name requests no kept sample has (yet), e.g. "
            f"{escape(', '.join(unmatched[:3]))}[/]: only a sampled share of requests is kept "
            "(the deployment's sample rate); their labels are kept and joined if it arrives."
        )


def read_labels(text: str) -> dict[str, Any]:
    """Labels by request id from CSV (``request_id,label``) or JSON lines.

    Raises:
        InvalidParameter: a line that is neither, a missing column, or a request id twice.
    """
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        raise InvalidParameter("the labels file is empty")
    pairs = _json_lines(lines) if lines[0].lstrip().startswith("{") else _csv_rows(text)
    found: dict[str, Any] = {}
    for request_id, label in pairs:
        if request_id in found:
            raise InvalidParameter(f"request id {request_id!r} appears twice in the labels file")
        found[request_id] = label
    return found


def _json_lines(lines: list[str]) -> list[tuple[str, Any]]:
    pairs = []
    for number, line in enumerate(lines, 1):
        try:
            item = json.loads(line)
        except json.JSONDecodeError:
            raise InvalidParameter(f"line {number} of the labels file is not JSON") from None
        if not isinstance(item, dict) or "request_id" not in item or "label" not in item:
            raise InvalidParameter(f'line {number} needs "request_id" and "label"')
        pairs.append((str(item["request_id"]), item["label"]))
    return pairs


def _csv_rows(text: str) -> list[tuple[str, Any]]:
    rows = list(csv.DictReader(io.StringIO(text)))
    if not rows or not {"request_id", "label"} <= set(rows[0]):
        raise InvalidParameter("a CSV labels file needs the columns request_id and label")
    return [(row["request_id"], _csv_value(row["label"])) for row in rows]


def _csv_value(text: str | None) -> Any:
    """A CSV cell as a number where it reads as one (``1``, ``0.5``), else the text."""
    if text is None:
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            continue
    return text
