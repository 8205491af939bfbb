"""Where a recording came from: one *session* per recorder that wrote into a buffer or a log
(the env's id and keywords where it was made from an id, its wrappers, the versions of the
packages involved, the host, process and start time, and the policy tag the user set), and, in
a log, the number of its first episode: episode ``k`` of a log was recorded by the last session
whose ``first_episode`` is at most ``k`` (a policy tag names the episodes that ended under it).

A session is plain JSON (str, int, float, bool, None, lists and string-keyed dicts of those):
buffer files and episode logs keep the list of them in their headers, and `sessions` checks one
read from a file (it is data, never code). Imports: `errors` only.
"""

from __future__ import annotations

import importlib.metadata
import json
import math
import os
import socket
import sys
import time
from collections.abc import Mapping
from typing import Any

from flexibuff_envs.errors import InvalidArgumentError, short_repr

#: the keys of a session, each with the JSON types its value may have
KEYS: dict[str, tuple[type, ...]] = {
    "api": (str,),
    "env_id": (str,),
    "env_kwargs": (dict, type(None)),
    "gym_spec": (str,),
    "wrappers": (list,),
    "versions": (dict,),
    "host": (str,),
    "pid": (int,),
    "started": (float, int),
    "policy": (str,),
    "first_episode": (int, type(None)),
}
#: sessions a header may list, and bytes one session's JSON may take
MAX_SESSIONS, MAX_SESSION_BYTES = 100_000, 1 << 22
#: the packages whose versions a session names (the env's own is added)
PACKAGES = ("flexibuff_envs", "gymnasium", "pettingzoo", "numpy")


def session(env: Any, api: str, *, policy: str = "", env_kwargs: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A session of recording ``env`` (speaking ``api``) begun now, tagged ``policy``.

    ``env_kwargs``: the keywords ``env`` was made with, where its own spec does not tell them (a
    PettingZoo env: the CLI passes them)."""
    env_id, kwargs = _made_from(env, api)
    return {
        "api": api,
        "env_id": env_id,
        "env_kwargs": _plain(dict(env_kwargs)) if env_kwargs is not None else kwargs,
        "gym_spec": _gym_spec(env, api),
        "wrappers": _wrappers(env),
        "versions": _versions(env),
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "started": time.time(),
        "policy": policy_tag(policy),
        "first_episode": None,
    }


def unknown() -> dict[str, Any]:
    """The session of episodes whose recording is not known (a log written before sessions were
    kept, merged into one that keeps them), from its first episode."""
    return {
        "api": "unknown",
        "env_id": "",
        "env_kwargs": None,
        "gym_spec": "",
        "wrappers": [],
        "versions": {},
        "host": "",
        "pid": 0,
        "started": 0.0,
        "policy": "",
        "first_episode": 0,
    }


def policy_tag(tag: Any) -> str:
    """``tag`` checked: a string of at most 200 characters (`InvalidArgumentError` otherwise)."""
    if not isinstance(tag, str) or len(tag) > 200:
        raise InvalidArgumentError(f"policy: a tag is a string of at most 200 characters, got {short_repr(tag)}")
    return tag


def sessions(value: Any, where: str) -> list[dict[str, Any]]:
    """The sessions ``value`` (a header's JSON) lists, checked: a list of objects with `KEYS`,
    each of its types; `InvalidArgumentError` (a ValueError) naming ``where`` and the problem otherwise."""
    if not isinstance(value, list) or len(value) > MAX_SESSIONS:
        raise InvalidArgumentError(
            f"{where} must be a list of at most {MAX_SESSIONS:,} sessions, got {short_repr(value)}"
        )
    for k, item in enumerate(value):
        if not isinstance(item, dict) or set(item) != set(KEYS):
            raise InvalidArgumentError(f"{where}[{k}] must be an object of {sorted(KEYS)}, got {short_repr(item)}")
        for key, kinds in KEYS.items():
            if not isinstance(item[key], kinds) or isinstance(item[key], bool):
                raise InvalidArgumentError(f"{where}[{k}] {key} must be {' or '.join(t.__name__ for t in kinds)}")
        if not 0 <= item["started"] < 1e11 or item["pid"] < 0 or (item["first_episode"] or 0) < 0:
            raise InvalidArgumentError(f"{where}[{k}] holds a start time, pid or first episode out of range")
        if not all(isinstance(w, str) for w in item["wrappers"]):
            raise InvalidArgumentError(f"{where}[{k}] wrappers must be names")
        if not all(isinstance(v, str) for v in item["versions"].values()):
            raise InvalidArgumentError(f"{where}[{k}] versions must map names to version strings")
        if len(json.dumps(item)) > MAX_SESSION_BYTES:
            raise InvalidArgumentError(f"{where}[{k}] takes more than {MAX_SESSION_BYTES:,} bytes")
    return value


def _made_from(env: Any, api: str) -> tuple[str, dict[str, Any] | None]:
    """The id ``env`` can be made again from and its keywords (None: not known), or ``("", None)``."""
    spec = getattr(env, "spec", None)
    if api == "vector" and spec is None and getattr(env, "envs", None):  # SB3's VecEnvs: their first sub-env's
        spec = getattr(env.envs[0], "spec", None)
    if api in ("gymnasium", "vector") and spec is not None and getattr(spec, "id", None):
        kwargs = getattr(spec, "kwargs", None)
        return str(spec.id), _plain(dict(kwargs)) if isinstance(kwargs, Mapping) else None
    if api in ("parallel", "aec"):
        raw = getattr(env, "unwrapped", env)
        name = getattr(raw, "metadata", {}).get("name")
        family = type(raw).__module__.rsplit(".", 2)[0]  # pettingzoo.classic.connect_four.connect_four
        if isinstance(name, str) and family and family != type(raw).__module__:
            return f"{family}.{name}", None
    return "", None


def _gym_spec(env: Any, api: str) -> str:
    """Gymnasium's own JSON of the spec ``env`` was made from (``gym.make`` of it makes it again,
    time limit and wrappers included), or "" (no spec, or keywords JSON cannot hold)."""
    spec = getattr(env, "spec", None)
    if api != "gymnasium" or spec is None or not hasattr(spec, "to_json"):
        return ""
    try:
        return str(spec.to_json())
    except (ValueError, TypeError):  # gymnasium raises ValueError for keywords JSON cannot hold
        return ""


def _wrappers(env: Any) -> list[str]:
    """The classes around the bare env, outermost first."""
    names: list[str] = []
    while hasattr(env, "env") and env is not getattr(env, "env", None) and len(names) < 100:
        names.append(f"{type(env).__module__}.{type(env).__qualname__}")
        env = env.env
    return names


def _versions(env: Any) -> dict[str, str]:
    """The versions of `PACKAGES` this process imported, and of the package ``env`` comes from."""
    bare = getattr(env, "unwrapped", env)
    own = type(bare).__module__.split(".")[0]
    found = {}
    for name in (*PACKAGES, own):
        if name in sys.modules or name == "flexibuff_envs":
            try:
                found[name] = importlib.metadata.version(name.replace("_", "-"))
            except importlib.metadata.PackageNotFoundError:
                version = getattr(sys.modules.get(name), "__version__", None)
                if isinstance(version, str):
                    found[name] = version
    return found


def _plain(value: Any) -> Any:
    """``value`` as JSON holds it: what JSON cannot hold (an object, NaN) as its repr."""
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    return repr(value)
