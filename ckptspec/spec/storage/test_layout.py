"""What a checkpoint directory holds and in which order it becomes durable."""

import os
import re
import uuid
from typing import NamedTuple

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from ckptspec.spec.drivers import saving
from ckptspec.spec.harness import strategies
from ckptspec.spec.harness.processes import remove

pytestmark = pytest.mark.needs("storage_writer")
DATA_FILE = re.compile(r"^(?P<group>.*)__(?P<rank>\d+)_(?P<k>\d+)\.distcp$")


def _layout_problems(path, thread_count, hint):
    """Every way the directory breaks FS-5 / FS-6 (an empty list when it conforms)."""
    names = sorted(os.listdir(path))
    data = [n for n in names if n.endswith(".distcp")]
    problems = [f"unexpected file {n!r}" for n in names if n != ".metadata" and n not in data]
    parsed = {n: DATA_FILE.match(n) for n in data}
    problems += [f"data file {n!r} is not named {{prefix}}__{{rank}}_{{k}}.distcp" for n, m in parsed.items() if not m]
    ks = sorted(int(m["k"]) for m in parsed.values() if m)
    if ks != list(range(len(ks))):
        problems.append(f"file numbers {ks} are not 0..{len(ks) - 1}")
    if len(data) > thread_count:
        problems.append(f"{len(data)} data files for thread_count={thread_count}")
    problems += [
        f"{n!r} has group {m['group']!r}, rank {m['rank']}"
        for n, m in parsed.items()
        if m and (m["group"] not in ("", hint) or m["rank"] != "0")
    ]
    storage = saving.read_metadata(path).storage_data
    used = {info.relative_path for info in storage.values()}
    problems += [f"data file {n!r} holds no item" for n in data if n not in used]
    if hint is not None:
        problems += [
            f"item {index.fqn!r} is in {info.relative_path!r}"
            for index, info in storage.items()
            if index.fqn.startswith(hint) != info.relative_path.startswith(hint)
        ]
    return problems


def _save_and_inspect(tmp, state_dict, thread_count, hint):
    path = os.path.join(tmp, uuid.uuid4().hex)
    saving.async_save(state_dict, path, persistent=None, thread_count=thread_count, separation_hint=hint)
    problems = _layout_problems(path, thread_count, hint)
    remove(path)
    return problems


@pytest.mark.spec("FS-5", "FS-6")
@given(
    state_dict=strategies.dcp_state_dicts(),
    thread_count=st.integers(1, 5),
    hint=st.sampled_from([None, "a", "b", "sh"]),
)
def test_data_files_are_named_counted_and_grouped_as_documented(
    rank_pool, tmp_path_factory, state_dict, thread_count, hint
):
    if hint is not None and thread_count < 2:
        hint = None
    problems = rank_pool(1).run(
        _save_and_inspect, str(tmp_path_factory.mktemp("layout")), state_dict, thread_count, hint
    )[0]
    assert not problems, f"thread_count={thread_count}, separation_hint={hint!r}: " + "; ".join(problems)


class _DurabilityLog:
    """Records os.fsync (with the descriptor's path) and os.rename / os.replace while active.

    Forked children inherit the recording, and every record is appended to one file, so writes made in
    child processes are seen too.
    """

    def __init__(self, log_path):
        self.log_path, self._saved = log_path, {}

    def _record(self, *fields):
        with open(self.log_path, "a") as f:
            f.write("\t".join(fields) + "\n")

    def __enter__(self):
        self._saved = {name: getattr(os, name) for name in ("fsync", "rename", "replace")}
        real = self._saved

        def fsync(fd):
            self._record("fsync", os.path.realpath(os.readlink(f"/proc/self/fd/{fd}")))
            return real["fsync"](fd)

        def renamer(name):
            def rename(src, dst, *args, **kwargs):
                result = real[name](src, dst, *args, **kwargs)
                self._record("rename", os.path.realpath(src), os.path.realpath(dst))
                return result

            return rename

        os.fsync, os.rename, os.replace = fsync, renamer("rename"), renamer("replace")
        return self

    def __exit__(self, *exc):
        for name, fn in self._saved.items():
            setattr(os, name, fn)

    def events(self):
        with open(self.log_path) as f:
            return [tuple(line.rstrip("\n").split("\t")) for line in f]


class Durability(NamedTuple):
    path: str  # the checkpoint directory
    data_files: list[str]
    events: list[tuple]  # ("fsync", path) and ("rename", source, destination), in order


def _durability_events(tmp):
    path = os.path.realpath(os.path.join(tmp, "ckpt"))
    state_dict = {"w": torch.arange(64.0), "b": torch.ones(3, 3), "step": 3}
    with _DurabilityLog(os.path.join(tmp, "log")) as log:
        saving.async_save(state_dict, path, persistent=None, thread_count=2)
    return Durability(path, [os.path.join(path, n) for n in saving.data_files(path)], log.events())


def _commit_index(events, metadata):
    commits = [i for i, e in enumerate(events) if e[0] == "rename" and e[2] == metadata]
    assert commits, f"{metadata} never came into existence by a rename (it was written in place); events: {events}"
    return commits[-1]


@pytest.mark.spec("FS-7")
def test_data_is_durable_before_the_metadata_is_renamed_into_place(rank_pool, tmp_path):
    path, data_files, events = rank_pool(1).run(_durability_events, str(tmp_path))[0]
    commit = _commit_index(events, os.path.join(path, ".metadata"))
    before = events[:commit]
    unsynced = [f for f in data_files if ("fsync", f) not in before]
    assert not unsynced, f"data files {unsynced} were not fsynced before .metadata was committed; events: {events}"
    tmp_name = events[commit][1]
    assert ("fsync", tmp_name) in before, f"{tmp_name} was renamed to .metadata without an fsync; events: {events}"


@pytest.mark.spec("FS-8")
def test_the_directory_is_fsynced_after_the_metadata_rename(rank_pool, tmp_path):
    path, _, events = rank_pool(1).run(_durability_events, str(tmp_path))[0]
    commit = _commit_index(events, os.path.join(path, ".metadata"))
    assert ("fsync", path) in events[commit + 1 :], (
        f"the checkpoint directory was not fsynced after .metadata was renamed into place; events: {events}"
    )
