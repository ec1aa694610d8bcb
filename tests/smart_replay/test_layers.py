"""The package's imports and calls only point down, with no cycles.

The packages of `smart_replay` follow the data flow, lowest first (`LAYERS`).
A module may import modules of its own package or of a package below it,
never above; no two modules import each other, directly or through others,
counting every import (inside functions and `TYPE_CHECKING` blocks too); the
write path and the read path (`INDEPENDENT`) never import each other, their
shared formats live below both (`layouts`), and outside `layouts` a layout is
used only through its protocol (`layouts.protocol.StepLayout`), never asked
which format it is. A call into a lower package
never hands it a callback that climbs back up (`climbing_callbacks`). A
module over 400 lines is worth a look (a warning: two concepts?); over 600
fails. The root `__init__.py` is exempt: it names its public modules in
strings and imports them on first use.
"""

import ast
import os
from typing import Dict, List, Set
import warnings

import pytest

ROOT = os.path.join(os.path.dirname(__file__), '..', '..', 'smart_replay')
# Lowest first. The root modules `errors` and `_reverb_internal` are layer 0.
LAYERS = ('', 'utils', 'ops', 'spec', 'layouts', 'config', 'storage',
          'server', 'control', 'backends', 'writing', 'sampling', 'manager',
          'integrations', 'remote', 'tools', 'apps')
# Packages that must not import each other, whatever their order.
INDEPENDENT = (('writing', 'sampling'),)
WARN_LINES, MAX_LINES = 400, 600


def _modules() -> Dict[str, str]:
  """{dotted module name: path} of every module of the package."""
  found = {}
  for folder, dirs, files in os.walk(ROOT):
    dirs[:] = [d for d in dirs if d != '__pycache__']
    rel = os.path.relpath(folder, ROOT)
    parts = ['smart_replay'] + ([] if rel == '.' else rel.split(os.sep))
    for name in files:
      if name.endswith('.py'):
        stem = name[:-3]
        dotted = '.'.join(parts if stem == '__init__' else parts + [stem])
        found[dotted] = os.path.join(folder, name)
  return found


def _imports(path: str, modules: Dict[str, str]) -> Set[str]:
  """The package's modules that `path` imports, anywhere in the file."""
  with open(path) as f:
    tree = ast.parse(f.read(), path)
  names = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      names.update(a.name for a in node.names)
    elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
      for alias in node.names:
        full = f'{node.module}.{alias.name}'
        names.add(full if full in modules else node.module)
  return {n for n in names if n in modules}


def _package(module: str) -> str:
  """The top package of a module under smart_replay ('' for root modules)."""
  parts = module.split('.')
  return parts[1] if len(parts) > 2 or (
      len(parts) == 2 and parts[1] in LAYERS) else ''


MODULES = _modules()
GRAPH = {m: _imports(p, MODULES) for m, p in MODULES.items()
         if m != 'smart_replay'}


def test_every_package_has_a_layer():
  unknown = sorted({_package(m) for m in GRAPH} - set(LAYERS))
  assert not unknown, f'packages without a place in LAYERS: {unknown}'


def upward_imports(graph: Dict[str, Set[str]]) -> List[str]:
  """'a -> b' for every import of a module from a higher package."""
  upward = []
  for module, imported in sorted(graph.items()):
    level = LAYERS.index(_package(module))
    for other in sorted(imported):
      if LAYERS.index(_package(other)) > level:
        upward.append(f'{module} -> {other}')
  return upward


def cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
  """The import cycles: strongly connected components (Tarjan) of over one
  module, or a module importing itself."""
  index, low, stack, on_stack, found = {}, {}, [], set(), []

  def visit(v):
    index[v] = low[v] = len(index)
    stack.append(v)
    on_stack.add(v)
    for w in sorted(graph.get(v, ())):
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on_stack:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      component = []
      while True:
        w = stack.pop()
        on_stack.discard(w)
        component.append(w)
        if w == v:
          break
      if len(component) > 1 or v in graph.get(v, ()):
        found.append(sorted(component))

  for module in sorted(graph):
    if module not in index:
      visit(module)
  return found


def test_imports_only_point_down():
  upward = upward_imports(GRAPH)
  assert not upward, 'imports of a higher package:\n' + '\n'.join(upward)


def test_no_module_cycles():
  assert not cycles(GRAPH), f'import cycles: {cycles(GRAPH)}'


def test_the_checks_see_an_upward_import_and_a_cycle():
  graph = {m: set(i) for m, i in GRAPH.items()}
  graph['smart_replay.spec.specs'].add('smart_replay.manager.facade')
  assert upward_imports(graph) == [
      'smart_replay.spec.specs -> smart_replay.manager.facade']
  graph = {m: set(i) for m, i in GRAPH.items()}
  graph['smart_replay.spec.specs'].add('smart_replay.layouts.packed_steps')
  assert cycles(graph) == [['smart_replay.layouts.packed_steps',
                            'smart_replay.spec.specs']]


def crossed(graph: Dict[str, Set[str]]) -> List[str]:
  """'a -> b' for every import between two `INDEPENDENT` packages."""
  found = []
  for module, imported in sorted(graph.items()):
    for other in sorted(imported):
      pair = {_package(module), _package(other)}
      if any(pair == set(p) for p in INDEPENDENT):
        found.append(f'{module} -> {other}')
  return found


def test_the_write_and_read_paths_do_not_import_each_other():
  assert not crossed(GRAPH), 'imports between independent packages:\n' + (
      '\n'.join(crossed(GRAPH)))


def _aliases(tree: ast.AST) -> Dict[str, str]:
  """{local name: package module} of a module's imports."""
  aliases = {}
  for node in ast.walk(tree):
    if isinstance(node, ast.ImportFrom) and node.module and not node.level:
      for alias in node.names:
        full = f'{node.module}.{alias.name}'
        if full in MODULES:
          aliases[alias.asname or alias.name] = full
    elif isinstance(node, ast.Import):
      for alias in node.names:
        if alias.name in MODULES:
          aliases[alias.asname or alias.name] = alias.name
  return aliases


def _climbs(callable_node: ast.AST, level: int, aliases: Dict[str, str],
            functions: Dict[str, ast.AST]) -> bool:
  """Whether a callable (a lambda, a function of the module, a bound method
  of `self`) refers to `self` or to a module of a package at `level` or
  above: called from below, it would call back up."""
  if isinstance(callable_node, ast.Attribute) or (  # self.method, self
      isinstance(callable_node, ast.Name) and callable_node.id == 'self'):
    return True
  body = (callable_node if isinstance(callable_node, ast.Lambda)
          else functions[callable_node.id])
  for node in ast.walk(body):
    if isinstance(node, ast.Name):
      if node.id == 'self':
        return True
      target = aliases.get(node.id)
      if target and LAYERS.index(_package(target)) >= level:
        return True
  return False


def climbing_callbacks(sources: Dict[str, str]) -> List[str]:
  """'module:line call(argument)' for every callable handed to a function
  or class of a lower package that refers back to the caller's package or
  one above it: a lambda, a function of the module, a bound method of
  `self` or `self` itself passed as an argument.

  Args:
    sources: {module name: its source text}.
  """
  found = []
  for module, text in sorted(sources.items()):
    if module == 'smart_replay':
      continue
    tree = ast.parse(text)
    level = LAYERS.index(_package(module))
    aliases = _aliases(tree)
    # Functions of the module; a name also bound as a variable or an
    # argument somewhere is not taken for one.
    bound = {n.id for n in ast.walk(tree)
             if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    bound |= {a.arg for n in ast.walk(tree) if isinstance(n, ast.arguments)
              for a in n.args + n.kwonlyargs + n.posonlyargs}
    methods = {n.name for n in ast.walk(tree)
               if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    functions = {n.name: n for n in ast.walk(tree)
                 if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                 and n.name not in bound}
    for node in ast.walk(tree):
      if not isinstance(node, ast.Call):
        continue
      base = node.func
      while isinstance(base, ast.Attribute):
        base = base.value
      callee = isinstance(base, ast.Name) and aliases.get(base.id)
      if not callee or LAYERS.index(_package(callee)) >= level:
        continue
      for arg in list(node.args) + [k.value for k in node.keywords]:
        handed = (isinstance(arg, ast.Lambda) or
                  (isinstance(arg, ast.Name) and arg.id == 'self') or
                  (isinstance(arg, ast.Name) and arg.id in functions) or
                  (isinstance(arg, ast.Attribute) and
                   isinstance(arg.value, ast.Name) and
                   arg.value.id == 'self' and arg.attr in methods))
        if handed and _climbs(arg, level, aliases, functions):
          found.append(f'{module}:{node.lineno} {ast.unparse(node.func)}'
                       f'({ast.unparse(arg)})')
  return found


def _sources() -> Dict[str, str]:
  sources = {}
  for module, path in MODULES.items():
    with open(path) as f:
      sources[module] = f.read()
  return sources


def test_no_callback_climbs_back_up():
  climbing = climbing_callbacks(_sources())
  assert not climbing, ('callbacks handed down that call back up (do the '
                        'work first, then call down):\n' + '\n'.join(
                            climbing))


def test_the_checks_see_crossed_paths_and_a_climbing_callback():
  graph = {m: set(i) for m, i in GRAPH.items()}
  graph['smart_replay.sampling.batcher'].add('smart_replay.writing.observer')
  assert crossed(graph) == [
      'smart_replay.sampling.batcher -> smart_replay.writing.observer']
  planted = {
      'smart_replay.manager.planted': (
          'from smart_replay.backends import local\n'
          'from smart_replay.manager import state\n'
          'class Part:\n'
          '  def flush(self):\n'
          '    pass\n'
          '  def run(self):\n'
          '    local.LocalBackend(flush=self.flush)\n'
          '    local.LocalBackend(counts=lambda: state.Counts())\n'
          '    local.LocalBackend(timeout=lambda: 3)\n'
          '    local.LocalBackend(owner=self)\n')}
  assert climbing_callbacks(planted) == [
      'smart_replay.manager.planted:7 local.LocalBackend(self.flush)',
      'smart_replay.manager.planted:8 local.LocalBackend(lambda: '
      'state.Counts())',
      'smart_replay.manager.planted:10 local.LocalBackend(self)']


def protocol_members(source: str) -> Set[str]:
  """The public members `StepLayout` declares in `layouts/protocol.py`."""
  for node in ast.parse(source).body:
    if isinstance(node, ast.ClassDef) and node.name == 'StepLayout':
      names = {n.target.id for n in node.body if isinstance(n, ast.AnnAssign)}
      names |= {n.name for n in node.body if isinstance(n, ast.FunctionDef)}
      return {n for n in names if not n.startswith('_')}
  raise AssertionError('layouts/protocol.py declares no StepLayout')


# A layout's description (`StepLayout.describe()`) is a dict, also named so.
_DESCRIPTION_METHODS = {'get', 'items', 'keys'}


def format_questions(sources: Dict[str, str], members: Set[str]) -> List[str]:
  """Uses of a layout outside `layouts` beyond its protocol, as `module:line
  name.attribute` (a name ending in 'layout' holds one)."""
  found = []
  for module, source in sorted(sources.items()):
    if module.startswith('smart_replay.layouts'):
      continue
    for node in ast.walk(ast.parse(source)):
      if not isinstance(node, ast.Attribute):
        continue
      base = node.value
      name = (base.id if isinstance(base, ast.Name) else
              base.attr if isinstance(base, ast.Attribute) else '')
      if (name.endswith('layout') and node.attr not in members and
          node.attr not in _DESCRIPTION_METHODS):
        found.append(f'{module}:{node.lineno} {name}.{node.attr}')
  return found


def test_layouts_are_used_through_their_protocol():
  sources = _sources()
  members = protocol_members(sources['smart_replay.layouts.protocol'])
  assert {'encoder', 'block_windows', 'decode'} <= members
  questions = format_questions(sources, members)
  assert not questions, (
      'a layout used beyond `layouts.protocol.StepLayout` (add what the '
      'write or read path needs to the protocol and to every layout):\n' +
      '\n'.join(questions))
  planted = {'smart_replay.writing.planted': (
      'def f(self):\n'
      '  if self._layout.stacked_field is not None:\n'
      '    return self._layout.encoder()\n')}
  assert format_questions(planted, members) == [
      'smart_replay.writing.planted:2 _layout.stacked_field']


@pytest.mark.parametrize('module', sorted(MODULES))
def test_module_is_short(module):
  with open(MODULES[module]) as f:
    lines = sum(1 for _ in f)
  assert lines <= MAX_LINES, (
      f'{MODULES[module]} has {lines} lines (over {MAX_LINES}: split it by '
      'meaning)')
  if lines > WARN_LINES:
    warnings.warn(f'{MODULES[module]} has {lines} lines: does it hold two '
                  'concepts?')
