"""Every Python block of the README and of docs/ runs, as written.

The blocks of one document run in order in one Python process of their own
(as cells of a notebook: a later block may use an earlier one's names),
forked from a server that imported TensorFlow, TF-Agents and smart_replay
once (as `python script.py` would, without paying the imports again), in an
empty working directory with the repository's `configs/` beside it (as in a
checkout). What a block takes as given (an agent, its environment, a starter
buffer the text's own command wrote) is made real by `tests/docs_prelude.py`
from real components; a block that talks to a standalone server at
'buffer-host:8000' gets a real `smart-replay-serve` on a free local port in
its place. A loop that would only train longer run more often runs fewer
rounds (`SHORTENED`). A failing block is named by its document and line.

Those blocks and the scripts of `examples/` use only what `smart_replay`
exports at its top level, and the demo environments
(`smart_replay.apps.envs...`); `public_api_problems` checks that without
running anything.
"""

import ast
import glob
import io
import multiprocessing
import os
import re
import runpy
import shutil
import signal
import subprocess
import sys
import tokenize
from typing import Dict, List, Optional, Tuple

import pytest

import smart_replay
from tests import docs_prelude
from tests.smart_replay.remote import remote_workers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCUMENTS = ['README.md'] + sorted(
    os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, 'docs',
                                                              '*.md')))
BLOCK = re.compile(r'^```python\n(.*?)^```', re.S | re.M)
SERVE = os.path.join(os.path.dirname(sys.executable), 'smart-replay-serve')
# Every script of examples/, named so that Bazel ships them to this test
# (`test_every_example_is_checked` keeps the list complete).
EXAMPLES = ('examples/dqn_atari.py', 'examples/dqn_cartpole_starter.py',
            'examples/offline_to_online.py', 'examples/remote_actors.py',
            'examples/sac_pendulum.py', 'examples/takeover.py')
PUBLIC = frozenset(smart_replay.__all__)
# The one package below the top level that users import: the environments of
# the demos and examples.
DEMO_ENVIRONMENTS = 'smart_replay.apps.envs'
NAMED = re.compile(r'\bsmart_replay(?:\.\w+)+')
# The documents' processes fork from a server that loaded these once (it
# makes no server, client or thread of theirs).
DOCUMENT_PROCESSES = multiprocessing.get_context('forkserver')
DOCUMENT_PROCESSES.set_forkserver_preload([
    'tests.test_docs', 'smart_replay.manager.facade',
    'tf_agents.agents.dqn.dqn_agent', 'tf_agents.train.learner'])
_DOCUMENT_TIMEOUT_S = 900
# Loops a document runs fewer times here than written: (as written, as run)
# per document. Every line still runs; the README's 20 rounds of collecting
# and training only train longer (each round about 1.5 s of the test).
SHORTENED = {'README.md': [('for _ in range(20):', 'for _ in range(2):')]}


def python_blocks(document: str) -> List[Tuple[int, str]]:
  """`(line, code)` of every ```python block of `document`."""
  with open(os.path.join(ROOT, document)) as f:
    text = f.read()
  return [(text[:m.start()].count('\n') + 2, m.group(1))
          for m in BLOCK.finditer(text)]


def _is_demo(path: str) -> bool:
  """Whether a dotted path is in the demo environments' package."""
  return path == DEMO_ENVIRONMENTS or path.startswith(DEMO_ENVIRONMENTS + '.')


def _is_public(path: str) -> bool:
  """Whether a dotted path (`smart_replay.X.y`) is public: a top-level name
  (and its attributes), or a demo environment module (and its names)."""
  parts = path.split('.')
  return (parts[0] != 'smart_replay' or len(parts) == 1 or parts[1] in PUBLIC
          or _is_demo(path))


class _PublicApiCheck(ast.NodeVisitor):
  """Collects the uses of `smart_replay` below its top-level names."""

  def __init__(self, bound: Dict[str, str]):
    self.bound = bound  # Local name -> the smart_replay module it names.
    self.problems: List[Tuple[int, str]] = []

  def _report(self, node: ast.AST, what: str) -> None:
    self.problems.append((node.lineno, what))

  def visit_Import(self, node: ast.Import) -> None:
    for alias in node.names:
      top = alias.name.split('.')[0]
      if top != 'smart_replay':
        self.bound.pop(alias.asname or top, None)
        continue
      if alias.name != 'smart_replay' and not _is_demo(alias.name):
        self._report(node, f'imports the submodule {alias.name}')
      # `import a.b.c` binds `a`; `import a.b.c as d` binds `d` to `a.b.c`.
      self.bound[alias.asname or top] = (alias.name if alias.asname
                                         else 'smart_replay')

  def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
    module = node.module or ''
    if node.level or module.split('.')[0] != 'smart_replay':
      for alias in node.names:
        self.bound.pop(alias.asname or alias.name, None)
      return
    if module != 'smart_replay' and not _is_public(module) and not all(
        _is_public(f'{module}.{alias.name}') for alias in node.names):
      self._report(node, f'imports from the submodule {module}')
    for alias in node.names:
      path = f'{module}.{alias.name}'
      if (module == 'smart_replay' and alias.name != '*' and
          alias.name not in PUBLIC):
        self._report(node, f'imports {path}, which smart_replay does not '
                     'export')
      local = alias.asname or alias.name
      if _is_demo(path):
        self.bound[local] = path  # A module (or a name) of the demos.
      else:
        self.bound.pop(local, None)

  def visit_Attribute(self, node: ast.Attribute) -> None:
    names, value = [], node
    while isinstance(value, ast.Attribute):
      names.append(value.attr)
      value = value.value
    if isinstance(value, ast.Name) and value.id in self.bound:
      path = '.'.join([self.bound[value.id]] + names[::-1])
      if not _is_public(path):
        self._report(node, f'uses {path}, which smart_replay does not export')
      return  # The whole chain is checked.
    self.generic_visit(node)

  def visit_Name(self, node: ast.Name) -> None:
    if isinstance(node.ctx, ast.Store):
      self.bound.pop(node.id, None)


def public_api_problems(code: str, bound: Optional[Dict[str, str]] = None
                        ) -> List[Tuple[int, str]]:
  """What `code` uses of `smart_replay` that is not its public API.

  Public: `import smart_replay`, `smart_replay.X` and `from smart_replay
  import X` for X in `smart_replay.__all__`, and the demo environments
  (`smart_replay.apps.envs...`). Anything else (a submodule imported, a
  name smart_replay does not export, `smart_replay.mixing`) is a problem,
  also when only a comment or a docstring names it (`smart_replay.x.y`).

  Args:
    code: Python source.
    bound: the names earlier code bound to smart_replay modules (updated),
      for the blocks of one document, which run in one namespace.

  Returns:
    `(line, what)` for each problem, in the order of the code.
  """
  check = _PublicApiCheck({'smart_replay': 'smart_replay'}
                          if bound is None else bound)
  check.visit(ast.parse(code))
  for token in tokenize.generate_tokens(io.StringIO(code).readline):
    if token.type in (tokenize.COMMENT, tokenize.STRING):
      for path in NAMED.findall(token.string):
        if not _is_public(path):
          check.problems.append(
              (token.start[0], f'names {path}, which smart_replay does not '
               'export'))
  return sorted(check.problems)


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
  smart_replay.save_spec(spec_file,
                         docs_prelude._cartpole()['agent'].collect_data_spec)  # pylint: disable=protected-access
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
  for written, run in SHORTENED.get(document, ()):
    assert sum(code.count(written) for _, code in blocks) == 1, (
        f'{document} no longer holds {written!r} once: update SHORTENED')
    blocks = [(line, code.replace(written, run)) for line, code in blocks]
  try:
    script = work / 'run_docs.py'
    script.write_text(_script(document, blocks))
    exitcode, stdout, stderr = _run_document(str(script), str(work))
  finally:
    if server is not None:
      server.send_signal(signal.SIGTERM)
      server.communicate(timeout=120)
  ran = re.findall(r'^ran (.*)$', stdout, re.M)
  assert exitcode == 0, (
      f'{document}: the block after {ran[-1] if ran else "the start"} '
      f'failed (exit code {exitcode}):\n{stderr[-4000:]}')
  assert len(ran) == len(blocks)


def _run_script(script: str, work: str) -> None:
  """Runs `script` as `python script` would, in `work`, its output in
  `stdout` and `stderr` beside `work` (in a document's process)."""
  os.chdir(work)
  for fd, name in ((1, 'stdout'), (2, 'stderr')):
    out = os.open(os.path.join(os.path.dirname(work), name),
                  os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(out, fd)
    os.close(out)
  sys.stdout = open(1, 'w', buffering=1, closefd=False)
  sys.stderr = open(2, 'w', buffering=1, closefd=False)
  sys.argv = [script]
  runpy.run_path(script, run_name='__main__')


def _run_document(script: str, work: str) -> Tuple[int, str, str]:
  """`(exit code, stdout, stderr)` of `script` run in a document's process;
  killed (exit code -9) after `_DOCUMENT_TIMEOUT_S`."""
  process = DOCUMENT_PROCESSES.Process(target=_run_script,
                                       args=(script, work))
  process.start()
  process.join(_DOCUMENT_TIMEOUT_S)
  if process.exitcode is None:
    process.kill()
    process.join(60)
  written = []
  for name in ('stdout', 'stderr'):
    path = os.path.join(os.path.dirname(work), name)
    with open(path) if os.path.exists(path) else io.StringIO() as f:
      written.append(f.read())
  return (process.exitcode, *written)


def test_the_documents_have_blocks_and_a_table_of_contents():
  assert len(python_blocks('README.md')) >= 2
  with open(os.path.join(ROOT, 'README.md')) as f:
    readme = f.read()
  assert readme.count('\n') <= 300
  for document in DOCUMENTS[1:]:
    assert f']({document})' in readme, f'{document} is not in the README'


@pytest.mark.unit
@pytest.mark.parametrize('document', DOCUMENTS)
def test_the_blocks_use_only_the_public_api(document):
  bound = {'smart_replay': 'smart_replay'}  # One namespace per document.
  problems = [f'{document}:{start + line - 1}: {what}'
              for start, code in python_blocks(document)
              for line, what in public_api_problems(code, bound)]
  assert not problems, '\n'.join(problems)


@pytest.mark.unit
@pytest.mark.parametrize('example', EXAMPLES)
def test_the_examples_use_only_the_public_api(example):
  with open(os.path.join(ROOT, example)) as f:
    problems = [f'{example}:{line}: {what}'
                for line, what in public_api_problems(f.read())]
  assert not problems, '\n'.join(problems)


@pytest.mark.unit
def test_every_example_is_checked():
  # Bazel's runfiles add an empty __init__.py to the folder; no example.
  found = glob.glob(os.path.join(ROOT, 'examples', '*.py'))
  assert sorted(os.path.relpath(path, ROOT) for path in found
                if os.path.basename(path) != '__init__.py') == sorted(EXAMPLES)


# The snippets below spell the package `{P}`, so that tools/bazel/
# build_deps.py does not take the modules they name for this test's deps.
P = 'smart_replay'


@pytest.mark.unit
@pytest.mark.parametrize('code, problem', [
    (f'from {P}.tools import takeover',
     f'imports from the submodule {P}.tools'),
    (f'from {P}.apps import binary',
     f'imports from the submodule {P}.apps'),
    (f'import {P}.integrations.paired',
     f'imports the submodule {P}.integrations.paired'),
    (f'from {P} import paired',
     f'imports {P}.paired, which {P} does not export'),
    (f'import {P}\nx = 1\n{P}.telemetry.BufferSummaries(m)',
     f'uses {P}.telemetry.BufferSummaries, which {P} does '
     'not export'),
    (f'import {P} as sr\nsr.mixing.FractionSchedule()',
     f'uses {P}.mixing.FractionSchedule, which {P} does not '
     'export'),
    (f'import {P}.apps.envs.thermal\n{P}.apps.binary.run(m)',
     f'uses {P}.apps.binary.run, which {P} does not export'),
    (f'from {P}.apps.envs import thermal as t\nt.x\n'
     f'import {P}.spec.specs as specs\nspecs.save_spec(f, s)',
     f'imports the submodule {P}.spec.specs'),
    (f'f({P}.sampling.mixing.count_sources(d, c))',
     f'uses {P}.sampling.mixing.count_sources, which {P} '
     'does not export'),
    (f'x = 1  # {P}.spec.specs.save_spec(...)',
     f'names {P}.spec.specs.save_spec, which {P} does not '
     'export'),
    (f'"""Counted by `sampling.mixing` ({P}.sampling.mixing)."""',
     f'names {P}.sampling.mixing, which {P} does not '
     'export'),
])
def test_the_public_api_check_finds_private_uses(code, problem):
  assert problem in [what for _, what in public_api_problems(code)]


@pytest.mark.unit
def test_the_public_api_check_follows_a_document_across_blocks():
  bound = {P: P}
  assert not public_api_problems(f'import {P} as sr', bound)
  assert public_api_problems('y = 2\nsr.telemetry', bound) == [
      (2, f'uses {P}.telemetry, which {P} does not export')]


@pytest.mark.unit
@pytest.mark.parametrize('code', [
    f'import {P}\n'
    f'm = {P}.ReplayBufferManager.from_checkpoint("b").close()\n'
    f'{P}.FractionSchedule(initial=0.5, final=0.1, steps=9)\n'
    f'info.source == {P}.ONLINE  # or {P}.STARTER',
    f'from {P} import (BufferShape, ReplayBufferManager,\n'
    '                          SmartReplayError, write_buffer_summaries)',
    f'from {P} import *',
    f'from {P}.apps.envs.gymnasium_env import GymnasiumEnv\n'
    'GymnasiumEnv("CartPole-v1").reset()',
    f'from {P}.apps.envs import atari_env\natari_env.make_atari_env(g)',
    f'from {P}.apps import envs',
    f'import {P}.apps.envs.thermal\n'
    f'{P}.apps.envs.thermal.ThermalZoneEnv()',
    'import tensorflow as tf\ntf.data.Dataset.range(3)',
    f'x = "{P}_scripts.serve"  # not the package; {P}/x.py',
])
def test_the_public_api_check_passes_public_uses(code):
  assert public_api_problems(code) == []
