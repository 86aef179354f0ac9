"""Storage errors (ENOSPC, EACCES, EIO) in the plan, write and finalize phases of a DCP save.

The errors come from the injected file-system layer (ckptspec.spec.drivers.faults.faultfs), installed for one
phase in the process(es) that run it:

- plan: the checkpoint directory cannot be created, on every rank (a read-only parent, a full or
  failing disk: the directory is shared, so every rank sees the same error);
- write: rank 1's data files fail: ENOSPC once 64 bytes are written (a size-limited file system),
  EACCES when a data file is opened for writing, EIO on the second write;
- finalize: the coordinator's metadata fails: ENOSPC on writing it (16-byte file system), EACCES on
  opening it, EIO on writing it.
"""

import os

import pytest

from ckptspec.faults import saves
from ckptspec.faults.faults import ERRNOS
from ckptspec.faults.storage_errors import WORLD, storage_errors
from ckptspec.spec.drivers.faults.tmpdirs import on_ranks


@pytest.mark.spec("FI-STORAGE-1", "FI-STORAGE-2")
@pytest.mark.needs("storage_writer", "persistent_caller")
@pytest.mark.parametrize("phase", ["plan", "write", "finalize"])
def test_storage_error_fails_the_save_on_every_rank(target, tmp_path, phase):
    results = on_ranks(WORLD, storage_errors, str(tmp_path), phase, timeout=150)
    save, tmp = saves.DcpSave(target), str(tmp_path)
    tried = [e for e in ERRNOS if all(e in r for r in results)]
    if tried and not any(r[e].fired for e in tried for r in results):
        pytest.skip(
            f"not judged: the fault layer saw no matching operation in {phase} for any error (the target writes "
            "through calls or processes the layer does not reach)"
        )
    problems = []
    for version, errno_name in enumerate(ERRNOS, start=1):
        if not all(errno_name in r for r in results):
            problems.append(f"{errno_name}: not tried (a rank hung before)")
            continue
        outcomes = [r[errno_name].outcome for r in results]
        if not any(r[errno_name].fired for r in results):
            problems.append(f"{errno_name}: the fault layer saw no matching operation in {phase} (not injected)")
        elif outcomes != ["CheckpointException"] * WORLD:
            problems.append(f"{errno_name} in {phase}: outcome per rank {outcomes}, should be CheckpointException")
        if save.committed(os.path.join(tmp, f"new-{errno_name}")):
            problems.append(f"{errno_name} in {phase}: the failed save wrote {save.MARKER}")
        after = [r[errno_name].after for r in results]
        if after != ["returned"] * WORLD:
            problems.append(f"{errno_name} in {phase}: the next save on the same queue: {after}")
        else:
            save.assert_loads(os.path.join(tmp, f"after-{errno_name}"), 10 + version, WORLD)
    save.assert_loads(os.path.join(tmp, "old"), 0, WORLD)
    assert not problems, "\n".join(problems)
