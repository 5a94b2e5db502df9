"""Skips for tests that need a tool on PATH, made strict where the tool must be present."""

import os
import shutil

import pytest


def skip_without_tool(tool, why):
    """Skips a test when `tool` is not on PATH, except where TFPS_REQUIRE_TOOLS=1 (the
    README test command sets it): there a missing tool fails the run instead of passing
    silently."""
    required = os.environ.get("TFPS_REQUIRE_TOOLS") == "1"
    if required and shutil.which(tool) is None:
        raise RuntimeError(f"TFPS_REQUIRE_TOOLS=1 but {tool} is not on PATH ({why})")
    return pytest.mark.skipif(shutil.which(tool) is None, reason=f"{tool} is not installed: {why}")
