"""Turn a name from the command line into an env: a Gymnasium id, a PettingZoo id or a module path."""

from __future__ import annotations

import contextlib
import difflib
import importlib
import importlib.util
import json
import pkgutil
import re
from dataclasses import dataclass
from typing import Any

import gymnasium as gym

from flexibuff_envs.errors import FlexibuffError

DEFAULT_ENV = "pettingzoo.classic.connect_four_v3"
PETTINGZOO_EXTRA = "pip install -e '.[pettingzoo]' in a clone of flexibuff_envs, or pip install pettingzoo mpe2"
_MODULE_PATH = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+")


class UsageError(FlexibuffError, ValueError):
    """Input the command line cannot act on; reported as one line on stderr."""


@dataclass(frozen=True)
class EnvChoice:
    """How to build the env a name stands for.

    Attributes:
        name: the name as given.
        api: "gymnasium", "vector", "parallel" or "aec".
        label: a short name for files and reports (``connect_four_v3``).
    """

    name: str
    api: str
    label: str


def resolve(name: str, *, api: str | None, num_envs: int) -> EnvChoice:
    """Decide which library and API ``name`` belongs to, without building the env.

    Gymnasium ids win; then PettingZoo registry ids (``classic/connect_four-v3``); then importable
    modules with ``env()`` / ``parallel_env()``. PettingZoo envs are recorded through their parallel
    API when they have one (all agents act at once), else through AEC; ``api`` overrides.
    """
    if name.startswith("ALE/") and name not in gym.registry:  # Atari's ids exist once ale_py registers them
        with contextlib.suppress(ImportError):
            import ale_py

            gym.register_envs(ale_py)
    in_gymnasium = name in gym.registry
    if not in_gymnasium and re.fullmatch(r"\w+_v\d+", name):  # a PettingZoo module's own name
        raise UsageError(f"unknown env {name}: not a Gymnasium id{_pettingzoo_module(name)}")
    registered = None if in_gymnasium else _pettingzoo_id(name)
    if registered is None and (in_gymnasium or not _MODULE_PATH.fullmatch(name)):
        if api is not None:
            raise UsageError(f"--api {api} is for PettingZoo envs; {name} is a Gymnasium id")
        return EnvChoice(name, "vector" if num_envs > 1 else "gymnasium", _label(name))
    target = registered or name
    if num_envs > 1:
        raise UsageError(
            f"--num-envs {num_envs}: PettingZoo envs are recorded one at a time; {name} is a PettingZoo env"
        )
    has_parallel = "parallel_env" in _creators(target, registered is not None)
    if api == "parallel" and not has_parallel:
        raise UsageError(f"--api parallel: {name} has no parallel API (its agents take turns); use --api aec")
    return EnvChoice(target, api or ("parallel" if has_parallel else "aec"), _label(target))


def make(choice: EnvChoice, *, num_envs: int, kwargs: dict[str, Any]) -> Any:
    """Build the env ``choice`` names, passing ``kwargs`` to its constructor."""
    if choice.api == "vector":
        return gym.make_vec(choice.name, num_envs=num_envs, vectorization_mode="sync", **kwargs)
    if choice.api == "gymnasium":
        return gym.make(choice.name, **kwargs)
    if "/" in choice.name:
        import pettingzoo

        return pettingzoo.make(choice.api, choice.name, **kwargs)
    return getattr(_import(choice.name), "parallel_env" if choice.api == "parallel" else "env")(**kwargs)


def wrapped(env: Any, wrappers: list[str]) -> Any:
    """``env`` in each wrapper ``wrappers`` names (``module.Name`` or ``module.Name:JSON``
    keywords), innermost first.

    Raises:
        UsageError: a wrapper that cannot be found, or whose keywords are not a JSON object.
    """
    for given in wrappers:
        path, _, keywords = given.partition(":")
        module, _, name = path.rpartition(".")
        try:
            kwargs = json.loads(keywords) if keywords else {}
            wrapper = getattr(importlib.import_module(module), name) if module else None
        except (ImportError, AttributeError, ValueError) as exc:
            raise UsageError(f"--wrap {given}: {type(exc).__name__}: {exc}") from None
        if not callable(wrapper) or not isinstance(kwargs, dict):
            raise UsageError(f"--wrap {given}: give module.Name of a wrapper, then :JSON keywords if any")
        env = wrapper(env, **kwargs)
    return env


def _label(name: str) -> str:
    return re.split(r"[/.:]", name)[-1]


def _pettingzoo_id(name: str) -> str | None:
    """The id PettingZoo's registry (1.27+) files ``name`` under, or None when it is not one."""
    if "/" not in name:
        return None
    try:
        import pettingzoo
        from pettingzoo.env_registry.exceptions import PettingZooRegistryError
    except ImportError:
        return None
    try:
        return str(pettingzoo.spec("aec", name).id)
    except PettingZooRegistryError:
        ids = list(pettingzoo.aec_registry)
        if not any(i.startswith(name.split("/")[0] + "/") for i in ids):
            return None  # another library's namespace: Gymnasium will say what it knows
        close = difflib.get_close_matches(name, ids, n=1)
        raise UsageError(f"unknown PettingZoo env {name}" + (f"; did you mean {close[0]}?" if close else ""))


#: the packages that hold PettingZoo envs as modules named ``<env>_v<N>``
_FAMILIES = ("pettingzoo.classic", "pettingzoo.butterfly", "pettingzoo.sisl", "pettingzoo.atari", "mpe2")


def _pettingzoo_module(name: str) -> str:
    """The hint for a PettingZoo env given by its module's own name (``pistonball_v6``): its
    module path and registry id, where one of `_FAMILIES` holds it."""
    for family in _FAMILIES:
        try:
            found = importlib.util.find_spec(f"{family}.{name}") is not None
        except ImportError:  # the family is not installed
            found = False
        if found:
            registry = f"{family.rpartition('.')[2]}/{name.replace('_v', '-v')}" if "." in family else ""
            also = f" or its registry id {registry}" if registry else ""
            return f"; PettingZoo's is named by its module, {family}.{name}{also}"
    return ""


def _creators(name: str, registered: bool) -> set[str]:
    """The env constructors ``name`` offers: a subset of {"env", "parallel_env"}."""
    if registered:
        import pettingzoo

        return {"env"} | ({"parallel_env"} if name in pettingzoo.parallel_registry else set())
    module = _import(name)
    found = {c for c in ("env", "parallel_env") if callable(getattr(module, c, None))}
    if not found:
        raise UsageError(f"{name} is a module but has neither env() nor parallel_env(): not a PettingZoo env")
    return found


def _import(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        hint = f" ({PETTINGZOO_EXTRA})" if missing in ("pettingzoo", "pygame", "mpe2") else ""
        if hint or missing and not (name == missing or name.startswith(missing + ".")):
            raise UsageError(f"importing {name} needs the module {missing}, which is not installed{hint}") from exc
        raise UsageError(
            f"unknown env {name}: not a Gymnasium id, a PettingZoo id or an importable module{_suggestion(name)}"
        ) from exc


def _suggestion(name: str) -> str:
    parent, _, leaf = name.rpartition(".")
    try:
        siblings = [m.name for m in pkgutil.iter_modules(importlib.import_module(parent).__path__)]
    except (ImportError, AttributeError):
        return ""
    close = difflib.get_close_matches(leaf, siblings, n=1)
    return f"; did you mean {parent}.{close[0]}?" if close else ""
