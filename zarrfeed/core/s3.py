"""zarrfeed's settings of s3fs and botocore: timeouts and retries that report an S3 store that stops answering
within about `zarrfeed_timeout` seconds (`s3_defaults`, applied by `Location.options`), a retry s3fs lacks
(`_retry_connect_timeouts`), range requests tried as often as any other call (`cat_ranges`), and botocore's "no
credentials" told by name (`missing_credentials`). s3fs and botocore are imported only when an S3 location is
opened (they come with the `s3` extra).
"""
from __future__ import annotations

import os
from typing import Any, Mapping, Sequence

from .errors import FormatError

TIMEOUT_OPTION = "zarrfeed_timeout"  # a storage option of zarrfeed's own (taken out before fsspec sees them)
S3_TIMEOUT = 15.0  # seconds: its default
S3_TRIES = 10  # tries of a call that gets no answer within the budget: s3fs's 5, twice (see s3_defaults)


def s3_defaults(options: Mapping[str, Any]) -> dict[str, Any]:
    """S3 storage options with timeouts and retries that report a store that stops answering within about
    `zarrfeed_timeout` seconds (default 15), for those the user has not set (in `options`, in fsspec's
    configuration, or botocore's retries in its environment variables).

    Why: left to themselves the layers multiply. s3fs tries a call 5 times after a timeout, botocore tries
    each of those up to 5 times (its "legacy" mode) with 5 s connect and 15 s read timeouts, and a loader that
    tries a window's chunks again multiplies them once more: a killed server would be reported after more than
    a minute, a paused one after several. Here botocore tries once (s3fs's retries remain, with their backoff
    of under 2 s a call) and the connect and read timeouts are a tenth of the budget; on S3 the loader fetches
    once (`Location.fetch_tries`), which is at most two calls (a read-ahead, then one more). A refused
    connection fails at once."""
    import fsspec.config

    try:
        budget = float(options.get(TIMEOUT_OPTION, S3_TIMEOUT))
    except (TypeError, ValueError):
        budget = 0.0
    if not budget > 0:
        raise FormatError(f"storage option {TIMEOUT_OPTION} must be a number of seconds > 0, "
                          f"got {options.get(TIMEOUT_OPTION)!r}")
    configured = fsspec.config.conf.get("s3", {})
    config = {**configured.get("config_kwargs", {}), **options.get("config_kwargs", {})}
    config.setdefault("connect_timeout", budget / S3_TRIES)
    config.setdefault("read_timeout", budget / S3_TRIES)
    if not {"AWS_MAX_ATTEMPTS", "AWS_RETRY_MODE"} & set(os.environ):
        config.setdefault("retries", {"total_max_attempts": 1})
    _retry_connect_timeouts()
    return {**options, "config_kwargs": config}


def _retry_connect_timeouts() -> None:
    """Have s3fs try again a call whose connection timed out. s3fs retries a call that timed out reading
    (botocore's `ReadTimeoutError`) but not one that timed out connecting (`ConnectTimeoutError` is not among
    its retryable errors), and botocore tries once here: a single lost SYN (retransmitted after 1 s) or a process
    starved for the 1.5 s connect timeout under load would fail the call at once. Nothing is sent on a
    connection never made, so another try is safe; `add_retryable_error`
    is s3fs's own way to say so (it applies to the process's s3fs, which gains nothing but these retries)."""
    try:
        import s3fs.core
        from botocore.exceptions import ConnectTimeoutError
    except ImportError:  # no s3fs: `Location.filesystem` says to install it
        return
    if not issubclass(ConnectTimeoutError, s3fs.core.S3_RETRYABLE_ERRORS):
        s3fs.core.add_retryable_error(ConnectTimeoutError)


RANGES_AT_ONCE = 64  # range requests in flight at once, per call


def cat_ranges(fs: Any, paths: Sequence[str], starts: Sequence[int], ends: Sequence[int | None]
               ) -> list[bytes | BaseException] | None:
    """The byte ranges [start, end) of objects (a negative start with no end: a suffix, `bytes=-N`, which S3
    answers without the object's size), concurrently, each as bytes or the error its request met; None if `fs`
    is not s3fs's (fsspec's `cat_ranges` serves those).

    Why not s3fs's own `cat_ranges`: it tries its request 5 times after a timeout, and each try is a call that
    itself tries 5 times, so a server that stops answering took 25 tries of a range (50 s at the read timeout
    of `s3_defaults`) where any other call gives up after 5 (10 s): a loader reading inner chunks of zarr v3
    shards reported a paused store five times later than one reading whole chunks. Here each range is one
    call with s3fs's tries; a connection that breaks while the bytes come is asked once more."""
    try:
        from s3fs import S3FileSystem
    except ImportError:
        return None
    if not isinstance(fs, S3FileSystem) or not hasattr(fs, "_call_s3") or not hasattr(fs, "_process_limits"):
        return None
    import asyncio

    from fsspec.asyn import sync

    async def one(path: str, start: int, end: int | None, gate: asyncio.Semaphore) -> bytes:
        bucket, key, version = fs.split_path(path)
        ask = {"Range": await fs._process_limits(path, start, end), **({"VersionId": version} if version else {})}
        async with gate:
            for attempt in range(2):
                answer = await fs._call_s3("get_object", Bucket=bucket, Key=key, **ask)  # tried as s3fs tries
                try:
                    return await answer["Body"].read()
                except Exception:
                    if attempt:
                        raise
                finally:
                    answer["Body"].close()
        raise AssertionError("unreachable")

    async def every() -> list[Any]:
        gate = asyncio.Semaphore(RANGES_AT_ONCE)
        return await asyncio.gather(*(one(p, s, e, gate) for p, s, e in zip(paths, starts, ends, strict=True)),
                                    return_exceptions=True)

    return sync(fs.loop, every)


def missing_credentials(exc: BaseException) -> bool:
    """Whether `exc` is botocore's "no credentials" (or "partial credentials") error, by name: botocore is
    only there with s3fs."""
    return any(c.__name__ in ("NoCredentialsError", "PartialCredentialsError") for c in type(exc).__mro__)
