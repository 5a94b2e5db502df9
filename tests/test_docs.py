"""Code that docs quote from the sources still says what the docs show: each block after an
`<!-- excerpt: path -->` line appears, line for line, in that file."""

import glob
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXCERPT = re.compile(r"<!-- excerpt: (\S+) -->\n```\w*\n(.*?)```", re.S)


def excerpts():
    for doc in sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")) + [os.path.join(ROOT, "README.md")]):
        with open(doc) as f:
            for i, match in enumerate(EXCERPT.finditer(f.read())):
                yield pytest.param(match.group(1), match.group(2),
                                   id=f"{os.path.basename(doc)}:{i}:{match.group(1)}")


@pytest.mark.parametrize("path, block", list(excerpts()))
def test_each_excerpt_is_in_its_file_as_shown(path, block):
    with open(os.path.join(ROOT, path)) as f:
        source = f.read().splitlines()
    lines = block.rstrip("\n").splitlines()
    starts = [i for i in range(len(source) - len(lines) + 1) if source[i:i + len(lines)] == lines]
    assert starts, f"{path} no longer holds:\n{block}"


def test_the_extending_guide_quotes_sources():
    assert len([p for p in excerpts() if "extending.md" in p.id]) >= 7
