"""AsyncRequest: fields, finalize functions, freeze, execute_sync, preload_fn, no-op requests."""

import functools
import os
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from ckptspec.spec.harness import workloads
from ckptspec.spec.harness.asserts import assert_equal, bounded
from ckptspec.spec.harness.processes import CALLERS, async_core, remove

FIELDS = ("async_fn", "async_fn_args", "finalize_fns", "async_fn_kwargs", "preload_fn", "is_frozen", "call_idx")


def _fields(req) -> dict:
    """Each field as (value, type): equal means equal by value and of the same type."""
    return {name: (getattr(req, name), type(getattr(req, name))) for name in FIELDS}


@pytest.mark.spec("AR-1")
def test_fields_order_and_defaults(core):
    cls = core.AsyncRequest
    assert issubclass(cls, tuple), f"AsyncRequest derives from {cls.__mro__}, but should be a NamedTuple"
    assert_equal("AsyncRequest._fields", cls._fields, FIELDS)
    req = cls(None, (), [])
    for name, default in (("preload_fn", None), ("is_frozen", False), ("call_idx", 0)):
        assert_equal(f"AsyncRequest(None, (), []).{name}", getattr(req, name), default)
    assert not req.async_fn_kwargs, f"async_fn_kwargs={req.async_fn_kwargs!r}, but should default to empty"
    with pytest.raises(TypeError):
        cls(None, ())


@pytest.mark.spec("AR-3")
def test_frozen_request_refuses_finalize_fns(core):
    frozen = core.AsyncRequest(None, (), [print]).freeze()
    before, fns_before = _fields(frozen), list(frozen.finalize_fns)
    with pytest.raises(RuntimeError):
        frozen.add_finalize_fn(print)
    # "Leaves the request unchanged": every field, by value and type, and the list's content.
    assert_equal("the frozen request's fields after a refused add_finalize_fn", _fields(frozen), before)
    assert_equal("its finalize_fns", list(frozen.finalize_fns), fns_before)


@pytest.mark.spec("AR-4")
@given(
    n=st.integers(0, 4),
    call_idx=st.integers(0, 9),
    kwargs=st.sampled_from([None, {}, {"k": 1}]),
    preload=st.booleans(),
    args=st.sampled_from([(), (1, 2), ("a", None, 3.5)]),
)
def test_freeze_returns_a_frozen_copy(core, n, call_idx, kwargs, preload, args):
    fns = [functools.partial(print, i) for i in range(n)]
    req = core.AsyncRequest(print, args, fns, kwargs, dict if preload else None, False, call_idx)
    before, fns_before = _fields(req), list(fns)
    frozen = req.freeze()
    assert frozen is not req, "freeze() returned the request itself, but should return a new one"
    assert type(frozen) is type(req), f"freeze() returned a {type(frozen).__name__}, not an AsyncRequest"
    assert_equal("frozen.is_frozen", frozen.is_frozen, True)
    # Equal in every other field, by value and by type: a list of finalize functions frozen into a tuple is
    # not equal to it (AR-4 says equal, not equivalent).
    after = _fields(frozen)
    for name in FIELDS:
        if name != "is_frozen":
            assert_equal(f"freeze(): (value, type) of field {name}", after[name], before[name])
    assert_equal("the original's fields after freeze()", _fields(req), before)
    assert req.finalize_fns is fns, "freeze() replaced the original request's list of finalize functions"
    assert_equal("the original's finalize_fns after freeze()", fns, fns_before)


@pytest.mark.spec("AR-5")
def test_frozen_copy_is_independent_of_the_original(core):
    req = core.AsyncRequest(None, (), [print])
    frozen = req.freeze()
    req.add_finalize_fn(repr)
    assert list(frozen.finalize_fns) == [print], (
        f"frozen.finalize_fns={list(frozen.finalize_fns)}, but should stay [print] "
        "after add_finalize_fn on the original"
    )


def _run_sync(n_initial, n_added, log_dir):
    log = os.path.join(log_dir, f"log{os.getpid()}")
    fns = [functools.partial(workloads.append_line, log, f"f{i}") for i in range(n_initial)]
    req = async_core().AsyncRequest(None, (), fns)
    for i in range(n_added):
        req.add_finalize_fn(functools.partial(workloads.append_line, log, f"f{n_initial + i}"))
    req.execute_sync()
    lines = Path(log).read_text().split()
    remove(log)
    return lines


@pytest.mark.spec("AR-2", "AR-6")
@given(n_initial=st.integers(0, 3), n_added=st.integers(1, 3))
def test_finalize_fns_run_in_insertion_order(rank_pool, tmp_path_factory, n_initial, n_added):
    log_dir = str(tmp_path_factory.mktemp("order"))
    assert_equal(
        "finalize fns run",
        rank_pool(1).run(_run_sync, n_initial, n_added, log_dir)[0],
        [f"f{i}" for i in range(n_initial + n_added)],
        call=f"execute_sync() with {n_initial} finalize fns, then {n_added} added",
    )


def _execute_sync_effects(tmp):
    log = os.path.join(tmp, "log")

    def preload():
        workloads.append_line(log, "preload")
        return "async"  # becomes argument 1 of async_fn: the text it appends

    # Two arguments, not the three of Megatron's writer: the queue's callers run a request of any layout, and
    # execute_sync is to do what they do.
    req = async_core().AsyncRequest(
        workloads.append_line,
        (log, "placeholder"),
        [functools.partial(workloads.append_line, log, "finalize")],
        preload_fn=preload,
    )
    req.execute_sync()
    return Path(log).read_text().split()


@pytest.mark.spec("AR-6", "AR-7")
def test_execute_sync_runs_preload_then_async_fn_then_finalize(rank_pool, tmp_path):
    """AR-6: execute_sync has the async path's effects, in order, for a request the async path runs; AR-7: the
    preloaded value reaches async_fn as argument 1. A target failing it names the clause it broke (its entry)."""
    assert_equal(
        "effects in order",
        rank_pool(1).run(_execute_sync_effects, str(tmp_path))[0],
        ["preload", "async", "finalize"],
        call="execute_sync() of a request with preload_fn",
    )


@dataclass(frozen=True)
class Preloaded:
    saved: object  # what async_fn received as argument 1 (and saved)
    args_unchanged: bool  # the request's async_fn_args afterwards


def _preload_contract(tmp, persistent):
    """preload_fn gets no arguments; its result becomes args[1]; the request's args stay as they were."""
    out = os.path.join(tmp, "out.pt")
    args = (None, "placeholder", out)
    core = async_core()
    req = core.AsyncRequest(
        workloads.save_when_open, args, [], preload_fn=functools.partial(_preloaded_value, "from-preload")
    )
    if persistent is None:
        req.execute_sync()
    else:
        queue = core.AsyncCallsQueue(persistent=persistent)
        queue.schedule_async_request(req)
        bounded(60, "maybe_finalize_async_calls(blocking=True)", queue.maybe_finalize_async_calls, True)
        queue.close()
    return Preloaded(torch.load(out), req.async_fn_args == args)


def _preloaded_value(value, *unexpected):
    if unexpected:
        raise TypeError(f"preload_fn was called with arguments {unexpected!r}")
    return value


@pytest.mark.spec("AR-7")
@pytest.mark.parametrize("persistent", [pytest.param(None, id="execute_sync"), *CALLERS])
def test_preload_fn_result_replaces_argument_one(rank_pool, tmp_path, persistent):
    assert_equal(
        "request",
        rank_pool(1).run(_preload_contract, str(tmp_path), persistent)[0],
        Preloaded(saved="from-preload", args_unchanged=True),
        call="a request whose preload_fn returns 'from-preload', run "
        + ("by execute_sync()" if persistent is None else f"on AsyncCallsQueue(persistent={persistent})"),
    )


@dataclass(frozen=True)
class NoopRequest:
    indices: tuple  # of a request with an async_fn, then one without
    pending: int  # after a blocking finalize
    effects: list  # in the order they happened


def _noop_request(tmp, persistent):
    log = os.path.join(tmp, f"noop-{persistent}")
    core = async_core()
    queue = core.AsyncCallsQueue(persistent=persistent)
    first = queue.schedule_async_request(
        core.AsyncRequest(workloads.append_line, (log, "real"), [functools.partial(workloads.append_line, log, "fin0")])
    )
    second = queue.schedule_async_request(
        core.AsyncRequest(None, (), [functools.partial(workloads.append_line, log, "fin1")])
    )
    bounded(
        30,
        "maybe_finalize_async_calls(blocking=True) with a no-op request pending",
        queue.maybe_finalize_async_calls,
        True,
    )
    pending = queue.get_num_unfinalized_calls()
    queue.close()
    return NoopRequest((first, second), pending, Path(log).read_text().split())


@pytest.mark.spec("AR-8")
@pytest.mark.parametrize("persistent", CALLERS)
def test_noop_request_gets_an_index_and_is_finalized(rank_pool, tmp_path, persistent):
    assert_equal(
        "queue",
        rank_pool(1).run(_noop_request, str(tmp_path), persistent)[0],
        NoopRequest(indices=(0, 1), pending=0, effects=["real", "fin0", "fin1"]),
        call="a request with an async_fn, then a no-op one; blocking finalize",
    )
