"""Shared by the kernel tests: each test starts with no recorded call signatures."""

import pytest


@pytest.fixture(autouse=True)
def fresh_signatures():
    """Each test launches afresh: a test that forces an internal choice (a group split, a tile path)
    must not replay a launch an earlier test made for the same call signature (kernels/launcher.py;
    tests/kernels/test_launcher.py tests the replays)."""
    from kernels.decode.interface import _SIGNATURES as decode
    from kernels.flash_attn.interface import _SIGNATURES as flash
    from kernels.linear_attn.chunk import _SIGNATURES as linear

    for sigs in (flash, linear, decode):
        sigs.clear()
    yield
    for sigs in (flash, linear, decode):
        sigs.clear()
