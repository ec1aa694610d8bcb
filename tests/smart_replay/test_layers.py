"""The package's imports only point down, with no cycles, in short modules.

The packages of `smart_replay` follow the data flow, lowest first (`LAYERS`).
A module may import modules of its own package or of a package below it,
never above; no two modules import each other, directly or through others,
counting every import (inside functions and `TYPE_CHECKING` blocks too); no
module is over 400 lines. The root `__init__.py` is exempt: it names its
public modules in strings and imports them on first use.
"""

import ast
import os
from typing import Dict, List, Set

import pytest

ROOT = os.path.join(os.path.dirname(__file__), '..', '..', 'smart_replay')
# Lowest first. The root modules `errors` and `_reverb_internal` are layer 0.
LAYERS = ('', 'utils', 'spec', 'layouts', 'config', 'storage', 'server', 'backends',
          'writing', 'sampling', 'manager', 'integrations', 'remote', 'tools',
          'apps')
MAX_LINES = 400


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


@pytest.mark.parametrize('module', sorted(MODULES))
def test_module_is_short(module):
  with open(MODULES[module]) as f:
    lines = sum(1 for _ in f)
  assert lines <= MAX_LINES, f'{MODULES[module]} has {lines} lines'
