"""Reads a Grafana dashboard through Grafana's own published schema and says what it does not
hold: the models of `grafana-foundation-sdk` (generated from Grafana's schemas, here those of
Grafana 11.6). A dashboard is read into the models and written back; a key the schema does not
know is dropped on the way, and is reported, as is any value read differently. The models do
not check what they read, so this does: each value against the type the schema gives it (a
boolean, a string, a number, one of an enum's values such as a variable's or a link's type).
Each panel's type must be a panel plugin the schema knows, and each query must be read as its
data source's query model, not kept as an unknown bag.

    python dashboard_schema.py DASHBOARD.json

Prints one problem a line and exits 1 when there is any.
"""

import enum
import json
import sys
import types
import typing

from grafana_foundation_sdk.cog import plugins, runtime
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import Dashboard, RowPanel


def differences(written, read, path, problems):
    """Where `read` (the dashboard as the schema read it) lost or changed `written`."""
    if isinstance(written, dict):
        if not isinstance(read, dict):
            problems.append(f"{path}: read as {type(read).__name__}")
            return
        for key, value in written.items():
            if key not in read:
                problems.append(f"{path}.{key}: not in the schema")
            else:
                differences(value, read[key], f"{path}.{key}", problems)
    elif isinstance(written, list):
        if not isinstance(read, list) or len(written) != len(read):
            problems.append(f"{path}: read differently")
            return
        for i, (w, r) in enumerate(zip(written, read)):
            differences(w, r, f"{path}[{i}]", problems)
    elif written != read:
        problems.append(f"{path}: {written!r} read as {read!r}")


def typed(value, hint, path, problems):
    """Whether `value` is of the schema's type `hint` at its top (a list, a model); notes in
    `problems` where it, or anything within it, is not."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if value is None:
        return True
    if hint in (typing.Any, object):
        # A panel's options and field config: the plugin's model when the schema knows it.
        if hasattr(value, "to_json"):
            model(value, path, problems)
        return True
    if origin in (typing.Union, types.UnionType):
        # The first of the types the value is (at its top), and what is wrong within it.
        for a in args:
            within = []
            if a is not type(None) and typed(value, a, path, within):
                problems.extend(within)
                return True
        problems.append(f"{path}: {value!r} is none of {hint}")
        return False
    if origin is typing.Literal:
        ok = value in args
    elif origin is list:
        ok = isinstance(value, list)
        if ok:
            for i, v in enumerate(value):
                typed(v, args[0], f"{path}[{i}]", problems)
    elif origin is dict:
        ok = isinstance(value, dict)
    elif isinstance(hint, type) and issubclass(hint, enum.Enum):
        ok = value in set(hint) or value in {e.value for e in hint}
    elif hint is bool:
        ok = isinstance(value, bool)
    elif hint is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif hint is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    elif hint is str:
        ok = isinstance(value, str)
    elif isinstance(hint, type) and (hasattr(hint, "from_json") or hint.__module__.endswith(".variants")):
        # A model, or one of the variants a plugin fills in (a data source's query).
        ok = isinstance(value, hint)
        if ok:
            model(value, path, problems)
    else:
        ok = True
    if not ok:
        problems.append(f"{path}: {value!r} is not a {getattr(hint, '__name__', hint)}")
    return ok


def model(obj, path, problems):
    """Checks each field of a model object against its type in the schema."""
    try:
        hints = typing.get_type_hints(type(obj))
    except NameError:
        return
    for name, value in vars(obj).items():
        if name in hints:
            typed(value, hints[name], f"{path}.{name}", problems)


def main():
    plugins.register_default_plugins()
    with open(sys.argv[1], encoding="utf-8") as f:
        written = json.load(f)
    problems = []
    try:
        dashboard = Dashboard.from_json(written)
    except (ValueError, KeyError, TypeError) as e:
        print(f"$: the schema cannot read it: {e!r}")
        sys.exit(1)
    read = json.loads(json.dumps(dashboard, cls=JSONEncoder))
    differences(written, read, "$", problems)
    model(dashboard, "$", problems)
    for i, panel in enumerate(dashboard.panels or []):
        if isinstance(panel, RowPanel):
            continue
        if runtime.panelcfg_config(panel.type_val) is None:
            problems.append(f"$.panels[{i}].type: {panel.type_val!r} is no panel the schema knows")
        for j, query in enumerate(panel.targets or []):
            if isinstance(query, runtime.UnknownDataquery):
                problems.append(f"$.panels[{i}].targets[{j}]: no data source query the schema knows")
    print("\n".join(problems))
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
