"""`shamal serve`: an Open Inference Protocol model server (REST + optional gRPC)."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import logging
import os
import re
import secrets
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from shamal.cli._common import handle_errors
from shamal.errors import InvalidParameter

logger = logging.getLogger(__name__)

_HELP_MODEL = (
    "NAME=PATH_OR_URI, repeatable. PATH is a model folder (shamal-model.json), an .onnx file or "
    "an MLflow model folder; URI is models:/NAME/VERSION, models:/NAME@ALIAS or "
    "models:/NAME/latest. NAME:VERSION=... serves several versions of one name."
)


@handle_errors
def serve(
    model: Annotated[list[str] | None, typer.Option("--model", "-m", help=_HELP_MODEL)] = None,
    http_port: Annotated[int, typer.Option(help="REST port (0 = any free port).")] = 8000,
    grpc_port: Annotated[int | None, typer.Option(help="gRPC port; off when not given.")] = None,
    host: Annotated[str, typer.Option(help="Interface to listen on.")] = "127.0.0.1",
    max_batch_size: Annotated[
        int, typer.Option(help="Most rows per dynamic batch (0 turns batching off).")
    ] = 32,
    max_queue_delay_us: Annotated[
        int, typer.Option(help="How long a request may wait for a fuller batch, in µs.")
    ] = 0,
    batching: Annotated[
        list[str] | None,
        typer.Option(
            help="NAME=MAX_BATCH[:DELAY_US]: this model's own batch limit and queue delay, in "
            "place of --max-batch-size and --max-queue-delay-us; repeatable."
        ),
    ] = None,
    queue_size: Annotated[
        int, typer.Option(help="Most requests waiting per model version; more get 429.")
    ] = 256,
    threads: Annotated[
        int, typer.Option(help="Intra-op threads per model (0 = runtime default).")
    ] = 0,
    device: Annotated[str, typer.Option(help="auto (CUDA when present), cpu or cuda.")] = "auto",
    trust: Annotated[
        list[str] | None,
        typer.Option(help="Allow this model's pickled files (MLflow sklearn); repeatable."),
    ] = None,
    torch_factory: Annotated[
        list[str] | None,
        typer.Option(help="NAME=module:function building a torch model for NAME; repeatable."),
    ] = None,
    deployment: Annotated[
        str | None,
        typer.Option(
            help="Serve a deployment's versions with its traffic split; versions it adds or "
            "drops later are loaded and unloaded while serving."
        ),
    ] = None,
    report_interval: Annotated[
        float,
        typer.Option(help="Seconds between two reports to (and spec checks of) the control plane."),
    ] = 5.0,
    max_request_bytes: Annotated[
        int, typer.Option(help="Largest request body (and gRPC message) in bytes.")
    ] = 64 * 1024 * 1024,
    drain_timeout: Annotated[
        float, typer.Option(help="Seconds to finish in-flight requests after SIGTERM.")
    ] = 30.0,
    reject_nonfinite: Annotated[
        bool, typer.Option(help="Answer 400 to NaN/Inf in float inputs (allowed by default).")
    ] = False,
    auth: Annotated[
        bool | None,
        typer.Option(
            "--auth/--no-auth",
            help="Ask callers for 'Authorization: Bearer <token>' (probes stay open). Default: "
            "on when serving from the platform (--deployment, models:/ URIs; callers use "
            "their Shamal tokens), off for local files on a loopback address. --auth with "
            "local files takes the token from SHAMAL_SERVE_TOKEN or prints a new one.",
        ),
    ] = None,
    allowed_host: Annotated[
        list[str] | None,
        typer.Option(
            help="A name clients use in the Host header; repeatable. Default: loopback names "
            "and --host (any name when --host is a wildcard)."
        ),
    ] = None,
    auth_cache_ttl: Annotated[
        float, typer.Option(help="Seconds a token the control plane accepted is trusted.")
    ] = 30.0,
) -> None:
    """Serve models over the Open Inference Protocol (KServe V2), REST and gRPC."""
    from shamal.serving import (
        BackendOptions,
        CoreOptions,
        InferenceCore,
        LatestVersionRouter,
        ServerOptions,
        load_repository,
        parse_model_option,
        run_server,
    )

    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    _check_numbers(max_batch_size, max_queue_delay_us, queue_size, threads, max_request_bytes)
    _check_device(device, report_interval)
    sources = [parse_model_option(option) for option in model or []]
    batch_limits, queue_delays = _batching(batching or [], {s.name for s in sources}, deployment)
    if not sources and deployment is None:
        raise InvalidParameter("Nothing to serve: give --model NAME=PATH (or --deployment NAME).")
    router: Any = None
    if deployment is not None:
        router = _deployment_router(deployment, report_interval)
    options = BackendOptions(
        threads=threads,
        device=device,
        default_max_batch_size=max_batch_size,
        torch_factories=_factories(torch_factory or []),
        max_batch_sizes=batch_limits,
    )
    repository = load_repository(sources, options, trusted=trust or [])
    if router is None:
        router = LatestVersionRouter(repository.version_map())
    core = InferenceCore(
        repository,
        router,
        features=_feature_lookup(router) if deployment is not None else None,
        options=CoreOptions(
            max_queue_delay_s=max_queue_delay_us / 1e6,
            queue_delays_s=queue_delays,
            queue_size=queue_size,
            allow_nonfinite=not reject_nonfinite,
            server_version=_version(),
        ),
    )
    on_stop = None
    if deployment is not None:
        on_stop = _follow_deployment(router, core, options, trust or [], drain_timeout)
    access = _access(auth, host, sources, deployment, auth_cache_ttl)
    server = ServerOptions(
        host,
        http_port,
        grpc_port,
        max_request_bytes,
        drain_timeout,
        access=access,
        allowed_hosts=_allowed_hosts(host, allowed_host or []),
    )
    code = run_server(core, server, on_stop=on_stop)
    repository.close()
    raise typer.Exit(code)


_WILDCARDS = ("0.0.0.0", "::", "")  # nosec B104 - names to recognise, not a bind


def _is_loopback(host: str) -> bool:
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _allowed_hosts(host: str, given: list[str]) -> frozenset[str] | None:
    """The Host allow-list: as the control plane's (loopback names plus the bound host; any
    name on a wildcard bind, where the names cannot be known)."""
    from shamal.serving import loopback_hosts

    if given:
        return frozenset(name.strip().lower() for name in given)
    if host in _WILDCARDS:
        return None
    return loopback_hosts(host)


def _access(
    auth: bool | None, host: str, sources: list[Any], deployment: str | None, ttl_s: float
) -> Any:
    """Who may call: the platform's tokens when serving from it, else a shared token or
    nobody asked (see ``--auth``).

    Raises:
        InvalidParameter: local files on a non-loopback address with neither flag given.
    """
    from shamal.serving import (
        OpenAccess,
        PlatformAccess,
        StaticToken,
        deployment_path,
        registered_model_path,
    )

    from_platform = deployment is not None or any(
        s.location.startswith("models:/") for s in sources
    )
    if auth is None and not from_platform and not _is_loopback(host):
        raise InvalidParameter(
            f"Serving local files on {host} would let anyone who reaches it call the models: "
            "pass --auth (callers send the printed token) or --no-auth (open to the network)."
        )
    if auth is False:
        if not _is_loopback(host):
            logger.warning("Serving on %s with --no-auth: anyone who reaches it may call", host)
        return OpenAccess()
    if auth is None and not from_platform:
        return OpenAccess()
    if ttl_s < 0:
        raise InvalidParameter("--auth-cache-ttl must be >= 0.")
    if from_platform:
        from shamal.client import ShamalClient

        resources = (
            {deployment: deployment_path(deployment)}
            if deployment is not None
            else {s.name: registered_model_path(_registered_name(s.location)) for s in sources}
        )
        url = ShamalClient().url
        logger.info("Callers authenticate with Shamal tokens, checked at %s", url)
        return PlatformAccess(url, resources, ttl_s=ttl_s)
    secret = os.environ.get("SHAMAL_SERVE_TOKEN", "").strip()
    if not secret:
        secret = secrets.token_urlsafe(32)
        print(
            f"Callers send 'Authorization: Bearer {secret}' (set SHAMAL_SERVE_TOKEN to choose it)"
        )
    return StaticToken(secret)


def _registered_name(uri: str) -> str:
    """``models:/NAME/VERSION`` or ``models:/NAME@ALIAS`` -> NAME."""
    rest = uri.removeprefix("models:/")
    return rest.split("@", 1)[0].split("/", 1)[0]


def _version() -> str:
    try:
        return importlib.metadata.version("shamal")
    except importlib.metadata.PackageNotFoundError:
        return "0.0.0"


def _check_numbers(batch: int, delay: int, queue: int, threads: int, body: int) -> None:
    if batch < 0 or delay < 0 or threads < 0:
        raise InvalidParameter("--max-batch-size, --max-queue-delay-us and --threads are >= 0.")
    if queue < 1:
        raise InvalidParameter("--queue-size must be at least 1.")
    if body < 1024:
        raise InvalidParameter("--max-request-bytes must be at least 1024.")


def _check_device(device: str, report_interval: float) -> None:
    """Refuse a device the backends do not know, and reports faster than 20 a second."""
    if device not in ("auto", "cpu", "cuda"):
        raise InvalidParameter("--device takes auto, cpu or cuda.")
    if not report_interval >= 0.05:
        raise InvalidParameter("--report-interval must be at least 0.05 seconds.")


# The name is checked against the served names, which --model already validated.
_BATCHING = re.compile(r"^([^=]{1,128})=(\d{1,6})(?::(\d{1,9}))?$")


def _batching(
    options: list[str], served: set[str], deployment: str | None
) -> tuple[dict[str, int], dict[str, float]]:
    """``--batching NAME=MAX_BATCH[:DELAY_US]`` options as (batch limits, delays in seconds)."""
    limits: dict[str, int] = {}
    delays: dict[str, float] = {}
    known = served | ({deployment} if deployment else set())
    for option in options:
        match = _BATCHING.match(option)
        if match is None:
            raise InvalidParameter(
                f"--batching takes NAME=MAX_BATCH[:DELAY_US], e.g. text=16:2000, not {option!r}."
            )
        name, limit, delay = match.groups()
        if name not in known:
            raise InvalidParameter(
                f"--batching names {name!r}, which is not served here; served: "
                f"{', '.join(sorted(known)) or 'nothing'}."
            )
        limits[name] = int(limit)
        if delay is not None:
            delays[name] = int(delay) / 1e6
    return limits, delays


def _factories(options: list[str]) -> dict[str, str]:
    found: dict[str, str] = {}
    for option in options:
        name, sep, target = option.partition("=")
        if not sep or not name or not target:
            raise InvalidParameter(f"--torch-factory takes NAME=module:function, not {option!r}.")
        found[name] = target
    return found


def _deployment_router(name: str, interval_s: float) -> Any:
    """The deployment's router, with its spec fetched (not started yet)."""
    from shamal.client import ShamalClient
    from shamal.serving import DeploymentRouter

    router = DeploymentRouter(ShamalClient(), name, interval_s=interval_s)
    if not router.refresh():
        raise InvalidParameter(
            f"Cannot fetch deployment '{name}' from the control plane; check SHAMAL_URL, "
            "SHAMAL_TOKEN and `shamal deploy list`."
        )
    return router


def _feature_lookup(router: Any) -> Any:
    """Online features for the deployment's requests, when its spec names a feature service
    (read from the spec in use at each request: a redeploy may name another)."""
    from shamal.client import ShamalClient
    from shamal.serving import OnlineFeatureLookup

    def service_for(model: str) -> str | None:
        spec = router.deployment
        return None if spec is None else spec.feature_service

    return OnlineFeatureLookup(ShamalClient(), service_for)


def _follow_deployment(
    router: Any, core: Any, options: Any, trusted: list[str], grace_s: float
) -> Callable[[], None]:
    """Load the deployment's versions now, then follow its changes while serving.

    The versions the spec lists are loaded before the server listens; one that fails is
    reported to the control plane (a canary is then rolled back), but if no primary loads
    there is nothing to serve and the server stops. Returns what stops the following.

    Raises:
        InvalidParameter: no primary version could be loaded.
    """
    from shamal.serving import VersionLoader, discard_download, load_version

    work = Path(tempfile.mkdtemp(prefix="shamal-serve-"))
    allowed = set(trusted)

    def load(source: Any) -> Any:
        return load_version(source, options, trusted=source.name in allowed, work_dir=work)

    class Host:
        """The inference core, and the downloaded files of a version dropped with it."""

        @staticmethod
        def install(served: Any) -> None:
            core.install(served)

        @staticmethod
        def retire(name: str, version: str, grace_s: float) -> None:
            core.retire(name, version, grace_s)
            discard_download(work, name, version)

    loader = VersionLoader(router.name, Host(), load, grace_s=grace_s)
    router.attach(loader)
    loader.run_pending()
    if router.serving is None:
        failed = "; ".join(
            f"v{version}: {status.reason}" for version, status in loader.statuses().items()
        )
        raise InvalidParameter(
            f"No primary version of deployment '{router.name}' could be loaded ({failed})."
        )
    loader.start()
    router.start()

    def stop() -> None:
        router.stop()
        loader.stop()

    return stop
