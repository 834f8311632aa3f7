"""``tierserve doctor``: what this machine has for tierserve, and which services answer.

Prints, in sections: the versions of tierserve, Python and numpy; cupy, the CUDA runtime and
driver, and every CUDA device (or that there is none: caches and the trainer then run on the
CPU with numpy); whether the CUDA kernels in ``cuda/`` compile (with cupy for the device when
there is one, and with NVRTC for the supported architectures when ``cuda-python`` is
installed); which optional extras are installed, and whether the native gRPC transport is;
and, given ``--config ps.json``, whether the
Redis or Redis Cluster nodes and the Kafka brokers it names answer, each within
``--timeout`` seconds.

Exit status: 0 when everything checked works (a missing GPU or extra is reported, not an
error); 1 when a service named in the config does not answer or a kernel does not compile.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import platform
import re
import socket
import sys
from dataclasses import asdict, dataclass

#: Each tier's or feature's distributions: pyproject's extras, and rocksdict (RocksDB, a
#: core dependency).
EXTRAS: dict[str, tuple[str, ...]] = {
    "gpu": ("cupy-cuda12x",),
    "redis": ("redis", "hiredis"),
    "kafka": ("confluent-kafka",),
    "rocksdb": ("rocksdict",),
    "triton": ("tritonclient",),
    "parquet": ("pyarrow",),
    "tensorboard": ("tensorboardX",),
    "datasource": ("fsspec",),
    "pandas": ("pandas",),
    "mpi": ("mpi4py", "mpich") if sys.platform == "linux" else ("mpi4py",),
    "mkl": ("mkl",),
}
_CORE = {"rocksdb"}
_CUPY_WHEELS = ("cupy-cuda12x", "cupy-cuda13x", "cupy-cuda11x", "cupy")


@dataclass
class Check:
    """One line of the report."""

    section: str
    name: str
    status: str  # "ok", "missing" (not installed / not present), "fail", "info"
    detail: str


def register(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "doctor",
        help="show GPU, CUDA kernels, installed extras and which configured services answer",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--config", help="ps.json whose Redis and Kafka addresses to check")
    parser.add_argument(
        "--timeout", type=float, default=1.0, help="seconds to wait for each service (default 1)"
    )
    parser.add_argument(
        "--no-compile", action="store_true", help="skip compiling the CUDA kernels"
    )
    parser.add_argument("--json", action="store_true", help="print the checks as JSON")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if not args.timeout > 0:
        print("tierserve doctor: error: --timeout must be positive", file=sys.stderr)
        return 2
    checks = diagnose(args.config, timeout=args.timeout, compile_kernels=not args.no_compile)
    if args.json:
        print(json.dumps([asdict(c) for c in checks], indent=2))
    else:
        print(render(checks))
    return 1 if any(c.status == "fail" for c in checks) else 0


def diagnose(
    config_path: str | None = None, timeout: float = 1.0, compile_kernels: bool = True
) -> list[Check]:
    """Every check, in report order.  A ``ps.json`` that cannot be read is itself a failed
    check (its error names the field), not an exception."""
    checks = _versions()
    cupy, gpu_checks = _gpu()
    checks += gpu_checks
    if compile_kernels:
        checks += _kernels(cupy)
    checks += _extras()
    checks.append(_native_transport())
    if config_path:
        checks += _services(config_path, timeout)
    return checks


def render(checks: list[Check]) -> str:
    """The report as text: one section heading, then ``[status] name: detail`` lines."""
    lines, section = [], None
    for c in checks:
        if c.section != section:
            section = c.section
            lines.append(f"{'' if not lines else chr(10)}{section}")
        lines.append(f"  [{c.status}] {c.name}: {c.detail}")
    return "\n".join(lines)


# -- machine ----------------------------------------------------------------------------------


def _dist_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _versions() -> list[Check]:
    import numpy as np

    from tierserve.server.version import version

    s = "tierserve"
    return [
        Check(s, "tierserve", "info", version()),
        Check(s, "python", "info", f"{platform.python_version()} ({sys.executable})"),
        Check(s, "numpy", "info", np.__version__),
        Check(s, "platform", "info", f"{platform.system()} {platform.machine()}"),
    ]


def _gpu():
    """``(cupy or None, checks)``: cupy when it imports and sees a device."""
    s = "GPU"
    installed = [(n, v) for n in _CUPY_WHEELS if (v := _dist_version(n))]
    try:
        import cupy
    except Exception as exc:
        detail = "not installed: pip install 'tierserve[gpu]'"
        if installed:
            detail = f"{installed[0][0]} {installed[0][1]} installed but does not import: {exc}"
        return None, [
            Check(s, "cupy", "missing", detail),
            Check(s, "devices", "missing", "none usable: caches and the trainer run on the CPU (numpy)"),
        ]
    checks = [Check(s, "cupy", "ok", f"{cupy.__version__} ({installed[0][0] if installed else 'cupy'})")]
    runtime = cupy.cuda.runtime
    try:
        rt = runtime.runtimeGetVersion()
        checks.append(Check(s, "CUDA runtime", "info", f"{rt // 1000}.{rt % 1000 // 10}"))
    except Exception as exc:
        checks.append(Check(s, "CUDA runtime", "missing", _first_line(exc)))
    try:
        drv = runtime.driverGetVersion()
        checks.append(Check(s, "CUDA driver", "info", f"{drv // 1000}.{drv % 1000 // 10}" if drv else "none"))
        count = runtime.getDeviceCount()
    except Exception as exc:
        checks.append(Check(s, "devices", "missing", f"no CUDA device ({_first_line(exc)}): "
                            "caches and the trainer run on the CPU (numpy)"))
        return None, checks
    if count < 1:
        checks.append(Check(s, "devices", "missing", "no CUDA device: caches and the trainer run "
                            "on the CPU (numpy)"))
        return None, checks
    for i in range(count):
        p = runtime.getDeviceProperties(i)
        name = p["name"].decode() if isinstance(p["name"], bytes) else str(p["name"])
        checks.append(Check(s, f"device {i}", "ok", f"{name}, sm_{p['major']}{p['minor']}, "
                            f"{p['totalGlobalMem'] / 2**30:.1f} GiB"))
    return cupy, checks


def _kernels(cupy) -> list[Check]:
    s = "CUDA kernels"
    checks = []
    if cupy is not None:
        from tierserve.cache.kernels import INSERT_KERNEL, LOOKUP_KERNEL, load_kernels

        try:
            load_kernels(required=True)
            checks.append(Check(s, "cupy", "ok", f"{LOOKUP_KERNEL}, {INSERT_KERNEL} compiled for device 0"))
        except Exception as exc:
            checks.append(Check(s, "cupy", "fail", f"{LOOKUP_KERNEL}: {exc}"))
    from tierserve.cache import nvrtc

    try:
        version = nvrtc.nvrtc_version()
    except nvrtc.NvrtcUnavailableError as exc:
        if cupy is None:
            checks.append(Check(s, "NVRTC", "missing", f"not checked without a GPU: {exc}"))
        return checks
    try:
        done = nvrtc.compile_all()
    except Exception as exc:
        checks.append(Check(s, f"NVRTC {version}", "fail", str(exc)))
        return checks
    sources = sorted({c.source for c in done})
    arches = ", ".join(dict.fromkeys(c.arch for c in done))
    checks.append(Check(s, f"NVRTC {version}", "ok", f"{', '.join(sources)} compiled for {arches}"))
    return checks


def _extras() -> list[Check]:
    checks = []
    for extra, dists in EXTRAS.items():
        if extra == "gpu":
            found = [(n, v) for n in _CUPY_WHEELS if (v := _dist_version(n))][:1]
            missing = [] if found else list(dists)
        else:
            found = [(n, v) for n in dists if (v := _dist_version(n))]
            missing = [n for n in dists if _dist_version(n) is None]
        have = ", ".join(f"{n} {v}" for n, v in found)
        if missing:
            how = " ".join(missing) if extra in _CORE else f"'tierserve[{extra}]'"
            detail = f"missing {', '.join(missing)}: pip install {how}"
            checks.append(Check("extras", extra, "missing", f"{have}; {detail}" if have else detail))
        else:
            checks.append(Check("extras", extra, "ok", have))
    return checks


def _native_transport() -> Check:
    """Whether gRPC can go over the native (Rust) transport or falls back to grpc.aio."""
    version = _dist_version("tierserve-native")
    from tierserve.server.grpc.native import native_available

    if native_available():
        return Check("extras", "native gRPC transport", "ok",
                     f"tierserve-native {version or '?'}: gRPC is served by the Rust transport")
    return Check("extras", "native gRPC transport", "missing",
                 "tierserve-native not installed: gRPC is served by grpc.aio; `make setup` "
                 "builds it where cargo is installed (or pip install ./server/native)")


# -- services -------------------------------------------------------------------------------


def _services(config_path: str, timeout: float) -> list[Check]:
    from tierserve.core.errors import TierserveError
    from tierserve.ps.config import load_ps_config

    s = f"services ({config_path})"
    try:
        config = load_ps_config(config_path)
    except TierserveError as exc:
        return [Check(s, "ps.json", "fail", str(exc))]
    checks = []
    vdb = config.volatile_db
    kind = vdb.type.value
    if kind in ("redis", "redis_cluster"):
        for address in _redis_addresses(vdb.address):
            checks.append(_check_redis(s, kind, address, vdb, timeout))
    else:
        checks.append(Check(s, f"volatile_db {kind}", "info", "in this process: nothing to reach"))
    pdb = config.persistent_db
    if pdb.type.value == "rocks_db":
        from pathlib import Path

        state = "exists" if Path(pdb.path).exists() else "absent (created at startup)"
        checks.append(Check(s, "persistent_db rocks_db", "info", f"{pdb.path}: {state}"))
    source = config.update_source
    if source.type.value == "kafka_message_queue":
        for broker in _split(source.brokers):
            checks.append(_check_kafka(s, broker, timeout))
    return checks


def _split(addresses: str) -> list[str]:
    return [a.strip() for a in re.split(r"[;,]", addresses) if a.strip()]


def _redis_addresses(address: str) -> list[str]:
    return [address] if "://" in address else _split(address)


def _host_port(address: str, default_port: int) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        return address.strip("[]") or "127.0.0.1", default_port
    return host.strip("[]") or "127.0.0.1", int(port)


def _check_redis(section: str, kind: str, address: str, config, timeout: float) -> Check:
    name = f"{kind} {address}"
    try:
        import redis
    except ImportError:
        host, port = _host_port(address, 6379)
        reached = _tcp(host, port, timeout)
        detail = "TCP port open" if reached is None else f"not answering: {reached}"
        return Check(section, name, "ok" if reached is None else "fail",
                     f"{detail} (redis-py missing, no PING: pip install 'tierserve[redis]')")
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    kwargs: dict = {"socket_timeout": timeout, "socket_connect_timeout": timeout,
                    "retry": Retry(NoBackoff(), 0)}
    if config.password:
        kwargs.update(username=config.user_name or None, password=config.password)
    if config.enable_tls:
        kwargs.update(ssl=True, ssl_ca_certs=config.tls_ca_certificate,
                      ssl_certfile=config.tls_client_certificate,
                      ssl_keyfile=config.tls_client_key, ssl_check_hostname=False)
    try:
        if "://" in address:
            client = redis.Redis.from_url(address, **kwargs)
        else:
            host, port = _host_port(address, 6379)
            client = redis.Redis(host=host, port=port, **kwargs)
        with client:
            client.ping()
            info = client.info("server")
            detail = f"answering (Redis {info.get('redis_version', '?')})"
            if kind == "redis_cluster":
                state = client.execute_command("CLUSTER INFO")
                if isinstance(state, bytes):
                    state = state.decode()
                if isinstance(state, str):
                    state = dict(
                        line.split(":", 1) for line in state.splitlines() if ":" in line
                    )
                detail += f", cluster_state {state.get('cluster_state', '?')}"
                if state.get("cluster_state") != "ok":
                    return Check(section, name, "fail", detail)
        return Check(section, name, "ok", detail)
    except Exception as exc:
        return Check(section, name, "fail", f"not answering within {timeout:g}s: {_first_line(exc)}")


def _check_kafka(section: str, broker: str, timeout: float) -> Check:
    name = f"kafka {broker}"
    host, port = _host_port(broker, 9092)
    reached = _tcp(host, port, timeout)
    if reached is not None:
        return Check(section, name, "fail", f"not answering within {timeout:g}s: {reached}")
    try:
        from confluent_kafka.admin import AdminClient
    except ImportError:
        return Check(section, name, "ok", "TCP port open (confluent-kafka missing, no metadata "
                     "request: pip install 'tierserve[kafka]')")
    admin = AdminClient({"bootstrap.servers": f"{host}:{port}", "log_level": 0,
                         "socket.timeout.ms": max(10, int(timeout * 1000))})
    try:
        meta = admin.list_topics(timeout=timeout)
    except Exception as exc:
        return Check(section, name, "fail", f"port open, but no Kafka metadata within "
                     f"{timeout:g}s: {_first_line(exc)}")
    hps = sum(1 for t in meta.topics if t.startswith("hps_et."))
    return Check(section, name, "ok", f"answering: {len(meta.brokers)} broker(s), "
                 f"{len(meta.topics)} topics ({hps} hps_et.*)")


def _tcp(host: str, port: int, timeout: float) -> str | None:
    """``None`` when a TCP connection opens within ``timeout``, else why not."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return None
    except OSError as exc:
        return _first_line(exc) or type(exc).__name__


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
