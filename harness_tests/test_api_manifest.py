"""The API manifest's checker (ckptspec/spec/nvrx_api.py) and its generator (ckptspec/spec/public_names.py): each kind of
difference between a callable and its documented parameters is reported, a malformed entry is refused, and
regenerating the released names keeps the hand-written part."""

from __future__ import annotations

import inspect
import types
import zipfile

import pytest

from ckptspec.spec import nvrx_api, public_names
from ckptspec.spec.nvrx_api import CALL, Parameter, check_documented


def _module() -> types.ModuleType:
    mod = types.ModuleType("fake.api")

    class Queue:
        def close(self, abort=False): ...
        def finalize(self, blocking, no_dist=True): ...

    def plan(state_dict, planner=None): ...

    mod.__dict__.update(Queue=Queue, plan=plan, VALUE=3)
    return mod


def _p(name, **way) -> Parameter:
    return Parameter.read({"name": name, **way})


def test_a_callable_as_documented_passes():
    check_documented(_module(), "Queue", "close", [_p("abort", default=False)])
    check_documented(_module(), "Queue", "finalize", [_p("blocking", required=True), _p("no_dist")])
    check_documented(_module(), "plan", CALL, [_p("state_dict", required=True), _p("planner", default_is_none=True)])


@pytest.mark.parametrize(
    ("name", "method", "params", "message"),
    [
        ("Caller", "close", [], "fake.api has no Caller"),
        ("Queue", "flush", [], "Queue.flush is missing"),
        ("VALUE", CALL, [], "VALUE is missing"),
        ("Queue", "close", [_p("force")], r"Queue.close\(self, abort=False\) has no parameter 'force'"),
        ("Queue", "close", [_p("abort", default=True)], "Queue.close: abort defaults to False, but should be True"),
        ("Queue", "finalize", [_p("no_dist", required=True)], "no_dist defaults to True, but should be <class"),
        ("Queue", "finalize", [_p("blocking", default=False)], "blocking defaults to <class 'inspect._empty'>"),
        ("plan", CALL, [_p("planner", default=0)], "plan: planner defaults to None, but should be 0"),
    ],
    ids=["no-name", "no-method", "not-callable", "no-parameter", "default", "required", "has-none", "none"],
)
def test_each_difference_is_reported(name, method, params, message):
    with pytest.raises(AssertionError, match=message):
        check_documented(_module(), name, method, params)


@pytest.mark.parametrize(
    "entry",
    [{"default": 1}, {"name": "a", "default": 1, "required": True}, {"name": "a", "optional": True}],
    ids=["no-name", "two-ways", "unknown-key"],
)
def test_a_malformed_parameter_is_refused(entry):
    with pytest.raises(ValueError, match="bad parameter"):
        Parameter.read(entry)


def test_the_manifest_reads_and_pins_what_it_says():
    close = nvrx_api.DOCUMENTED["API-1"]["async_ckpt.core"]["AsyncCallsQueue"]["close"]
    assert close == [Parameter("abort", True, False)]
    plan = nvrx_api.DOCUMENTED["FS-17"]["async_ckpt.state_dict_saver"]["save_state_dict_async_plan"][CALL]
    assert plan[0].default is inspect.Parameter.empty
    assert plan[2] == Parameter("process_group", True, None)
    assert set(nvrx_api.RELEASED) >= {"0.4.1", "0.7.0"}


def _wheel(directory, version: str, source: str) -> None:
    with zipfile.ZipFile(directory / f"nvidia_resiliency_ext-{version}-py3-none-any.whl", "w") as archive:
        archive.writestr(public_names.PACKAGE + "async_ckpt/core.py", source)
        archive.writestr(public_names.PACKAGE + "_private/hidden.py", "X = 1\n")


def test_regenerating_keeps_the_hand_written_part(tmp_path):
    _wheel(
        tmp_path, "9.9.9", "import os\nclass Q:\n    def __init__(self):\n        self.n = 0\n    def _p(self): ...\n"
    )
    manifest = tmp_path / "api.toml"
    manifest.write_text(f"# hand\n[documented]\n{public_names.GENERATED}\n[released.old]\n")
    public_names.main(["--write", str(manifest), str(tmp_path)])
    text = manifest.read_text()
    assert text.startswith(f"# hand\n[documented]\n{public_names.GENERATED}\n")
    assert "[released.old]" not in text
    assert '[released."9.9.9"."async_ckpt.core"]\n"" = ["Q"]\n"Q" = ["n"]' in text
    assert "hidden" not in text


def test_regenerating_refuses_a_file_without_the_marker_and_a_folder_without_wheels(tmp_path, capsys):
    manifest = tmp_path / "api.toml"
    manifest.write_text("[documented]\n")
    _wheel(tmp_path, "1.0", "A = 1\n")
    with pytest.raises(SystemExit):
        public_names.main(["--write", str(manifest), str(tmp_path)])
    assert "has no line" in capsys.readouterr().err
    assert manifest.read_text() == "[documented]\n"
    with pytest.raises(SystemExit):
        public_names.main([str(tmp_path / "empty")])
    assert "no nvidia_resiliency_ext-*.whl" in capsys.readouterr().err
