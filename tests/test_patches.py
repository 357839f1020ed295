"""The one patch-and-restore helper (perfscope/patches.py) and the patches built on it."""

from __future__ import annotations

import contextlib
import multiprocessing.process

import pytest

from perfscope.patches import replace


class Base:
    def greet(self):
        return "base"


class Child(Base):
    def greet(self):
        return "child"


def test_replace_puts_the_original_back_when_the_stack_closes():
    with contextlib.ExitStack() as stack:
        original = replace(stack, Child, "greet", lambda orig: lambda self: "patched " + orig(self))
        assert Child().greet() == "patched child"
    assert Child.__dict__["greet"] is original
    assert Child().greet() == "child" and Base().greet() == "base"


def test_replace_restores_on_an_error_and_in_reverse_order():
    with pytest.raises(RuntimeError), contextlib.ExitStack() as stack:
        replace(stack, Child, "greet", lambda orig: lambda self: "one")
        replace(stack, Child, "greet", lambda orig: lambda self: "two " + orig(self))
        assert Child().greet() == "two one"
        raise RuntimeError("the block failed")
    assert Child().greet() == "child"


def test_an_inherited_attribute_is_not_copied_down():
    class Plain(Base):
        pass

    with pytest.raises(KeyError), contextlib.ExitStack() as stack:
        replace(stack, Plain, "greet", lambda orig: orig)
    assert "greet" not in Plain.__dict__


def test_the_process_counter_and_the_one_profiler_guard_restore_what_they_patched():
    import torch

    from perfscope.collect.children import counting
    from perfscope.collect.one_profiler import only_ours

    start = multiprocessing.process.BaseProcess.__dict__["start"]
    with counting():
        assert multiprocessing.process.BaseProcess.__dict__["start"] is not start
    assert multiprocessing.process.BaseProcess.__dict__["start"] is start

    cls = torch.autograd.profiler.profile
    before = {n: cls.__dict__[n] for n in ("_prepare_trace", "_start_trace", "__exit__")}
    with only_ours(torch, object()):
        assert all(cls.__dict__[n] is not f for n, f in before.items())
    assert {n: cls.__dict__[n] for n in before} == before
