"""The README and docs/ hold only code that runs or matches its source: the README's quick
start trains and exports locally and under tfps-launch, and stock TensorFlow serves the
export; each block after an `<!-- excerpt: path -->` line appears, line for line, in that
file; every command shown names a script, module or flag that exists."""

import glob
import os
import re
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXCERPT = re.compile(r"<!-- excerpt: (\S+) -->\n```\w*\n(.*?)```", re.S)


DOCS = sorted(glob.glob(os.path.join(ROOT, "docs", "*.md"))) + [os.path.join(ROOT, "README.md")]


def read(path):
    with open(path) as f:
        return f.read()


def excerpts():
    for doc in DOCS:
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


def quick_start():
    return re.search(r"## Quick start\n.*?```python\n(.*?)```", read(os.path.join(ROOT, "README.md")),
                     re.S).group(1)


def served_auc(export_dir):
    """AUC of the export's predictions on the quick start's examples, in a process that
    never imports tfps."""
    program = f"""
import numpy as np, tensorflow as tf
from sklearn.metrics import roc_auc_score
rng = np.random.default_rng(0)
pairs = rng.integers(0, 1000, size=(8192, 2))
ids = rng.integers(-2**63, 2**63, size=1000, dtype=np.int64)[pairs]
labels = (np.sin(pairs[:, 0]) + np.cos(pairs[:, 1]) > 0).astype(np.float32)
serve = tf.saved_model.load({export_dir!r}).signatures["serving_default"]
(name,) = serve.structured_input_signature[1]
(out,) = serve(**{{name: tf.constant(ids)}}).values()
import sys; assert "tfps" not in sys.modules
print(roc_auc_score(labels, out.numpy().ravel()))
"""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    env.pop("PYTHONPATH", None)
    out = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, env=env,
                         timeout=300, cwd=os.path.dirname(export_dir))
    assert out.returncode == 0, out.stderr[-3000:]
    return float(out.stdout.split()[-1])


@pytest.mark.parametrize("launch", [[], [sys.executable, "-m", "tfps.launch", "--num_ps", "2",
                                         "--num_workers", "2"]], ids=["local", "tfps-launch"])
def test_the_readme_quick_start_trains_and_stock_tensorflow_serves_its_export(tmp_path, launch):
    assert len(quick_start().splitlines()) <= 30
    (tmp_path / "quickstart.py").write_text(quick_start())
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2",
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    command = (launch or [sys.executable]) + ["quickstart.py"]
    out = subprocess.run(command, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    # 1000 users and 1000 items, each its own row whichever shard holds it.
    assert "rows: 2000" in out.stdout + out.stderr
    (version,) = (tmp_path / "export").iterdir()  # export/<seconds>, as TF Serving expects
    assert version.name.isdigit()
    assert served_auc(str(version)) > 0.75  # the rows trained


def test_the_readme_keras3_quick_start_trains_saves_and_stock_tensorflow_serves_it(tmp_path):
    program = re.search(r"## Keras 3\n.*?```python\n(.*?)```", read(os.path.join(ROOT, "README.md")), re.S).group(1)
    (tmp_path / "keras3_start.py").write_text(program)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("TF_USE_LEGACY_KERAS", None)  # TensorFlow's default: tf.keras is Keras 3
    out = subprocess.run([sys.executable, "keras3_start.py"], capture_output=True, text=True, env=env,
                         cwd=tmp_path, timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    assert "rows: 2000" in out.stdout and (tmp_path / "model.keras").exists()
    assert served_auc(str(tmp_path / "export_keras3" / "1")) > 0.75  # the rows trained


def shown_commands():
    """(doc, command) for every indented or fenced shell line that runs a file or module."""
    for doc in DOCS:
        for line in re.findall(r"^(?:    )((?:python|bash|tfps-launch) .*)$", read(doc), re.M):
            yield os.path.basename(doc), line.split("#")[0].split()


def test_every_command_shown_names_what_exists():
    seen = 0
    launch_flags = subprocess.run([sys.executable, "-m", "tfps.launch", "--help"], capture_output=True,
                                  text=True, env=dict(os.environ, PYTHONPATH=ROOT)).stdout
    for doc, words in shown_commands():
        seen += 1
        if words[0] == "tfps-launch":
            for flag in (w for w in words if w.startswith("--") and not w.startswith("--data")):
                assert flag in launch_flags, (doc, words)
            words = ["python"] + [w for w in words if w.endswith(".py")]
        if words[1] == "-m":
            module = words[2].replace(".", "/")
            assert os.path.exists(os.path.join(ROOT, module + ".py")), (doc, words)
        else:
            assert os.path.exists(os.path.join(ROOT, words[1])), (doc, words)
    assert seen >= 15


def fenced(lang, docs):
    """(doc, block) for each ```lang block that is not an excerpt."""
    for doc in docs:
        for match in re.finditer(rf"(<!-- excerpt: \S+ -->\n)?```{lang}\n(.*?)```", read(doc), re.S):
            if not match.group(1):
                yield os.path.basename(doc), match.group(2)


def test_every_python_block_in_the_docs_runs(tmp_path):
    blocks = list(fenced("python", [d for d in DOCS if not d.endswith("README.md")]))  # README: above
    assert blocks, "no python blocks found"
    program = "import tensorflow as tf, tf_keras as keras, tfps\n" + "\n".join(
        f"# {doc}\n{block}" for doc, block in blocks)
    (tmp_path / "blocks.py").write_text(program)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", TF_USE_LEGACY_KERAS="1",
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "blocks.py"], capture_output=True, text=True, env=env,
                         cwd=tmp_path, timeout=300)
    assert out.returncode == 0, program + out.stderr[-3000:]


def test_the_kubernetes_job_passes_flags_its_program_takes():
    (block,) = [block for _, block in fenced("yaml", DOCS)]
    programs = set(re.findall(r"/app/(\S+?\.py)", block))
    assert programs == {"examples/train_ctr.py"}
    source = read(os.path.join(ROOT, "examples", "train_ctr.py"))
    for flag in set(re.findall(r'"(--\w+)"', block)):
        assert f'"{flag}"' in source, flag
