"""The one-line failure messages and the hints for failures the lab has met before."""

import os

from lab.base.errors import describe_failure, known_hint


def test_known_hints():
    class OutOfMemoryError(RuntimeError):  # torch.cuda.OutOfMemoryError, matched by name so no GPU is needed
        pass

    assert "--layers N" in known_hint(OutOfMemoryError("CUDA out of memory"))
    overwritten = RuntimeError("Error: accessing tensor output of CUDAGraphs that has been overwritten by a subsequent"
                               " run. Stack trace: File \"transformer_flux2.py\", line 540, in forward")
    assert "pytorch/pytorch#152887" in known_hint(overwritten) and "--no-compile-regional" in known_hint(overwritten)
    assert known_hint(ValueError("shapes do not match")) == ""


def test_describe_failure_is_one_line_with_the_traceback_in_a_file(monkeypatch):
    monkeypatch.delenv("LAB_TRACEBACK", raising=False)

    def inner():
        raise RuntimeError("Error: accessing tensor output of CUDAGraphs that has been overwritten by a subsequent run.")

    try:
        inner()
    except RuntimeError as e:
        line = describe_failure(e)
    assert "\n" not in line and "(in test_errors.py:" in line and "inner)" in line and "#152887" in line
    path = line.rsplit("Full traceback: ", 1)[1].split(" ")[0]
    try:
        assert "Traceback (most recent call last)" in open(path).read()
    finally:
        os.remove(path)


def test_unknown_names_list_the_known_ones_in_plain_english():
    from lab.base.errors import unknown_name

    message = str(unknown_name("fix", "unipc_stak", ["unipc_stack", "begin_index"]))
    assert "Did you mean `unipc_stack`?" in message and "Known fixes: begin_index, unipc_stack." in message
    assert "Known scenarios:" in str(unknown_name("scenario", "wna", ["wan"]))


def test_a_cleanup_that_fails_on_the_way_out_of_an_interruption_is_the_interruption():
    from lab.base.errors import Terminated, during_interruption

    def cleanup_fails(first: BaseException):
        try:
            raise first
        except BaseException:
            try:
                raise RuntimeError("profiler stopped before it had started")
            except RuntimeError as e:
                return e

    assert during_interruption(cleanup_fails(Terminated())) and during_interruption(cleanup_fails(KeyboardInterrupt()))
    assert during_interruption(Terminated())
    assert not during_interruption(cleanup_fails(ValueError("a real failure")))
    assert not during_interruption(RuntimeError("alone"))
    cause = RuntimeError("raised from")
    cause.__cause__ = KeyboardInterrupt()
    assert during_interruption(cause)
    both = RuntimeError("raised from an interruption while handling another failure")
    both.__context__, both.__cause__ = ValueError("handled"), Terminated()
    assert during_interruption(both)  # both links are followed, not the first one set
    loop = RuntimeError("a cycle of contexts")
    other = ValueError("x")
    loop.__context__, other.__context__ = other, loop
    assert not during_interruption(loop)  # ends
