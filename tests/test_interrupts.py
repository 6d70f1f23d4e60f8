"""A Ctrl-C is a Ctrl-C wherever it lands: the command exits 130, and nothing records it as a failure of what it
interrupted."""

import libcst as cst
import pytest
from libcst.codemod import TransformExit, VisitorBasedCodemodCommand

from lab import cli
from lab.apply import rewrite


class Interrupted(VisitorBasedCodemodCommand):
    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        raise KeyboardInterrupt  # what a Ctrl-C during a rewrite is; libcst turns it into a TransformExit


def test_a_ctrl_c_inside_a_libcst_rewrite_stays_a_ctrl_c():
    with pytest.raises(KeyboardInterrupt):
        rewrite.rewrite_source("x = 1\n", [Interrupted], "m.py")


def test_a_command_interrupted_in_a_rewrite_exits_130(monkeypatch, capsys):
    monkeypatch.setattr(rewrite, "transform_module", lambda *args, **kwargs: TransformExit())
    assert cli.main(["diff", "--fix", "unipc_device_const"]) == 130
    assert "Interrupted." in capsys.readouterr().err
