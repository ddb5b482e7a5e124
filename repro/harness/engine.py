"""What every family does to a real DeepSpeed engine: its config, watching ZeRO-3's reduce paths, teardown."""

from __future__ import annotations

from typing import Any

from repro.harness.scales import ReducePath


def ds_config(zero: Any, **overrides: Any) -> dict[str, Any]:
    return {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "zero_optimization": dict(zero) if isinstance(zero, dict) else zero.zero_section(),
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 2**30,
        **overrides,
    }


def destroy_engine(engine) -> None:
    # 0.14/0.15: ZeRO-3's destroy() deletes its flat bucket buffer, which exists only with
    # contiguous_gradients=True, and raises AttributeError otherwise. Give it one to delete.
    flat = "_DeepSpeedZeroOptimizer_Stage3__ipg_bucket_flat_buffer"
    if type(engine.optimizer).__name__ == "DeepSpeedZeroOptimizer_Stage3" and not hasattr(engine.optimizer, flat):
        setattr(engine.optimizer, flat, None)
    engine.destroy()


def spy(obj, name: str, record) -> None:
    """Call ``record`` before each call of ``obj.name``, which then runs unchanged (on this instance only)."""
    original = getattr(type(obj), name)

    def wrapper(*args, **kwargs):
        record(*args, **kwargs)
        return original(obj, *args, **kwargs)

    setattr(obj, name, wrapper)


def watch_reduce_paths(optimizer) -> dict[int, ReducePath]:
    """Per parameter id, which of ZeRO-3's two reduce methods handled its gradient."""
    seen: dict[int, ReducePath] = {}

    def contiguous(buffer, *args, **kwargs):
        # The bucket's parameters: ``params_in_ipg_bucket`` before 0.17, ``ipg_buckets[dtype].params`` after.
        if hasattr(optimizer, "params_in_ipg_bucket"):
            params = list(optimizer.params_in_ipg_bucket)
        else:
            params = list(optimizer.ipg_buckets[args[0] if args else kwargs.get("communication_data_type")].params)
        seen.update(dict.fromkeys(map(id, params), ReducePath.CONTIGUOUS))

    spy(optimizer, mangled_name(optimizer, "__avg_scatter_grads"),
        lambda params, *_, **__: seen.update(dict.fromkeys(map(id, params), ReducePath.AVG_SCATTER)))
    spy(optimizer, mangled_name(optimizer, "__avg_scatter_contiguous_grads"), contiguous)
    return seen


def zero3_path(paths: dict[int, ReducePath], param, where: str = "", what: str = "a gradient") -> ReducePath:
    """The reduce path ``watch_reduce_paths`` saw ``param``'s gradient take; an error when it saw none."""
    if id(param) not in paths:
        raise RuntimeError(f"{where}{what} went through neither ZeRO-3 reduce path")
    return paths[id(param)]


def mangled_name(optimizer, method: str) -> str:
    for cls in type(optimizer).__mro__:
        name = f"_{cls.__name__}{method}"
        if name in vars(cls):
            return name
    raise RuntimeError(f"{type(optimizer).__name__} has no {method}: not a ZeRO-3 optimizer this probe knows")


def full_gradients(engine, names: list[str], where: str = "") -> list[tuple[str, object, object]]:
    """(name, parameter, full reduced gradient) per name; a collective under ZeRO-3: every rank, same order."""
    from deepspeed.utils import safe_get_full_grad

    named = dict(engine.module.named_parameters())
    out = []
    for name in names:
        grad = safe_get_full_grad(named[name])
        if grad is None:
            raise RuntimeError(f"{where}DeepSpeed returned no gradient for {name}")
        out.append((name, named[name], grad))
    return out
