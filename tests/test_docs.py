"""Every Python block of the README and of docs/ runs, as written.

The blocks of one document run in order in one fresh Python process (as
cells of a notebook: a later block may use an earlier one's names), in an
empty working directory with the repository's `configs/` beside it (as in a
checkout). What a block takes as given (an agent, its environment, a starter
buffer the text's own command wrote) is made real by `tests/docs_prelude.py`
from real components; a block that talks to a standalone server at
'buffer-host:8000' gets a real `smart-replay-serve` on a free local port in
its place. A failing block is named by its document and line.
"""

import glob
import os
import re
import shutil
import signal
import subprocess
import sys
from typing import List, Tuple

import pytest

from tests import docs_prelude
from tests.smart_replay.remote import remote_workers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCUMENTS = ['README.md'] + sorted(
    os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, 'docs',
                                                              '*.md')))
BLOCK = re.compile(r'^```python\n(.*?)^```', re.S | re.M)
SERVE = os.path.join(os.path.dirname(sys.executable), 'smart-replay-serve')


def python_blocks(document: str) -> List[Tuple[int, str]]:
  """`(line, code)` of every ```python block of `document`."""
  with open(os.path.join(ROOT, document)) as f:
    text = f.read()
  return [(text[:m.start()].count('\n') + 2, m.group(1))
          for m in BLOCK.finditer(text)]


def _script(document: str, blocks: List[Tuple[int, str]]) -> str:
  """A program running the blocks in order, each compiled under its
  document and line so a traceback points at the text."""
  lines = [f'import sys; sys.path.insert(0, {ROOT!r})',
           'from tests import docs_prelude',
           f'globals().update(docs_prelude.context({"".join(c for _, c in blocks)!r}))']
  for line, code in blocks:
    padded = '\n' * (line - 1) + code
    lines.append(f'exec(compile({padded!r}, {document!r}, "exec"), globals())')
    lines.append(f'print("ran {document}:{line}", flush=True)')
  return '\n'.join(lines) + '\n'


def _start_server(tmp_path) -> Tuple[subprocess.Popen, str]:
  """`smart-replay-serve` for the CartPole agent's spec, on a free port."""
  spec_file = str(tmp_path / 'server' / 'spec.pbtxt')
  os.makedirs(os.path.dirname(spec_file))
  code = ('from tests import docs_prelude; from smart_replay.spec import specs;'
          f' specs.save_spec({spec_file!r}, docs_prelude._cartpole()["agent"]'
          '.collect_data_spec)')
  subprocess.run([sys.executable, '-c', code], check=True, cwd=ROOT,
                 timeout=300, capture_output=True)
  port = remote_workers.free_port_pair()
  server = subprocess.Popen(
      [SERVE, f'--spec_file={spec_file}',
       f'--checkpoint_dir={tmp_path}/server/buffer', f'--port={port}',
       '--capacity=10000'], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
      text=True)
  line = server.stdout.readline()  # The server prints it once serving.
  assert line.startswith('Serving'), (line, server.stderr.read()[-2000:])
  # The text's clients read a copy of its token, as a remote machine would.
  shutil.copy(f'{tmp_path}/server/buffer/control.token',
              tmp_path / 'work' / 'control.token')
  return server, f'localhost:{port}'


@pytest.mark.parametrize('document', [
    d for d in DOCUMENTS if python_blocks(d)])
def test_every_python_block_runs(document, tmp_path):
  blocks = python_blocks(document)
  work = tmp_path / 'work'
  shutil.copytree(os.path.join(ROOT, 'configs'), work / 'configs')
  server = None
  if docs_prelude.needs_server(''.join(code for _, code in blocks)):
    server, address = _start_server(tmp_path)
    blocks = [(line, code.replace('buffer-host:8000', address))
              for line, code in blocks]
  try:
    script = work / 'run_docs.py'
    script.write_text(_script(document, blocks))
    result = subprocess.run([sys.executable, str(script)], cwd=work,
                            capture_output=True, text=True, timeout=900)
  finally:
    if server is not None:
      server.send_signal(signal.SIGTERM)
      server.communicate(timeout=120)
  ran = re.findall(r'^ran (.*)$', result.stdout, re.M)
  assert result.returncode == 0, (
      f'{document}: the block after {ran[-1] if ran else "the start"} '
      f'failed:\n{result.stderr[-4000:]}')
  assert len(ran) == len(blocks)


def test_the_documents_have_blocks_and_a_table_of_contents():
  assert len(python_blocks('README.md')) >= 2
  with open(os.path.join(ROOT, 'README.md')) as f:
    readme = f.read()
  assert readme.count('\n') <= 300
  for document in DOCUMENTS[1:]:
    assert f']({document})' in readme, f'{document} is not in the README'
