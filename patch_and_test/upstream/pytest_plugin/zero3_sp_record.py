"""A pytest plugin for DeepSpeed's own test suite: picks a depth; pytest-reportlog records the results.

Loaded into DeepSpeed's pytest with ``-p zero3_sp_record`` (only its folder on PYTHONPATH): it imports nothing
of ours. Each test's reports carry ``ranks`` in their user_properties; deselected ids go to their own file.
"""

import pytest


def pytest_addoption(parser):
    group = parser.getgroup("zero3-sp-gradfix")
    group.addoption("--zero3-sp-deselected", default=None, help="append the ids the depth drops here, one a line")
    group.addoption("--zero3-sp-depth", default="full", choices=("quick", "full"))
    group.addoption("--zero3-sp-keep", action="append", default=[], help="a test class the quick depth keeps")


def needs_ranks(item) -> bool:
    cls = getattr(item, "cls", None)
    return cls is not None and any(base.__name__ == "DistributedExec" for base in cls.__mro__)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    keep_classes, quick = set(config.getoption("--zero3-sp-keep")), config.getoption("--zero3-sp-depth") == "quick"
    kept, dropped = [], []
    for item in items:
        ranks = needs_ranks(item)
        item.user_properties.append(("ranks", ranks))
        (dropped if quick and ranks and item.cls.__name__ not in keep_classes else kept).append(item)
    if dropped:
        # Appended by each xdist worker (they collect, the controller does not): read as a set.
        with open(config.getoption("--zero3-sp-deselected") or "/dev/null", "a") as out:
            out.write("".join(f"{item.nodeid}\n" for item in dropped))
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept
