"""How every `smart-replay-*` binary starts: help, flags, gin, logs, exit codes.

`run(main)` replaces `absl.app.run(main)` in the binaries of `scripts/`:

- `--help` (also `-h`, `--helpshort`) prints the program's description (its
  module docstring) and its own flags, and exits 0; `--helpfull` adds the
  flags of every library (TensorFlow's, absl's).
- Flag names take `-` or `_` alike (`--output-dir` is `--output_dir`).
- A bad flag, a missing required flag, a bad gin file or binding, and any
  `app.UsageError` print one line, `error: ...`, and exit 2; `--verbose` adds
  the traceback.
- Logging: absl INFO lines are shown and drawn above any tqdm progress bar
  (the bar stays intact); `--quiet` shows warnings and errors only and no
  progress bars; `--verbose` shows everything, TensorFlow's and Reverb's C++
  lines too (see `native_logs`, which the binaries install first).

Gin files are found by path or, failing that, by name among the configs this
package ships (`--gin_file=populate_thermal.gin` works from any directory;
see `configs.resolve`).
"""

import logging as std_logging
import sys
import textwrap
import traceback
from typing import Callable, List, Optional, Sequence

from absl import app
from absl import flags
from absl import logging
import gin
import tqdm

from smart_replay.apps import configs

EXIT_BAD_INPUT = 2
FLAGS = flags.FLAGS
_HELP = ('--help', '-h', '--helpshort', '-?', '--helpfull')


class BadInput(app.UsageError):
  """A bad command line, gin file or binding: exit 2 with one line."""

  def __init__(self, message: str):
    super().__init__(message, exitcode=EXIT_BAD_INPUT)


def _define_common_flags() -> None:
  if 'verbose' not in FLAGS:
    flags.DEFINE_boolean('verbose', False, 'Show every log line (TensorFlow '
                         'and Reverb included) and tracebacks of errors. '
                         '`-v` alone means --verbose.')
  if 'quiet' not in FLAGS:
    flags.DEFINE_boolean('quiet', False, 'Show warnings and errors only: no '
                         'progress bars, no INFO lines.')


def normalize_argv(argv: Sequence[str], known: Sequence[str]) -> List[str]:
  """Spells `--a-flag` as `--a_flag` and a lone `-v` as `--verbose`.

  Args:
    argv: the command line, program name first.
    known: the defined flag names.

  Returns:
    The command line absl parses. Arguments after `--` are left alone.
  """
  known = set(known)
  out, args = [argv[0]], list(argv[1:])
  for i, arg in enumerate(args):
    if arg == '--':
      return out + args[i:]
    if arg == '-v' and not (i + 1 < len(args) and
                            args[i + 1].lstrip('-').isdigit()):
      out.append('--verbose')
      continue
    if arg.startswith('--') and '-' in arg[2:].split('=', 1)[0]:
      name, sep, value = arg[2:].partition('=')
      underscored = name.replace('-', '_')
      if underscored.startswith('no_') and underscored[3:] in known:
        underscored = 'no' + underscored[3:]  # --no-overwrite
      bare = underscored[2:] if underscored.startswith('no') else underscored
      if underscored in known or bare in known:
        arg = f'--{underscored}{sep}{value}'
    out.append(arg)
  return out


def _module_name(main: Callable[..., int]) -> str:
  # absl files the flags of a `python -m` / script run under sys.argv[0].
  return sys.argv[0] if main.__module__ == '__main__' else main.__module__


def help_text(main: Callable[..., int], *, full: bool = False) -> str:
  """The `--help` page: the program's docstring and its own flags.

  Args:
    main: the binary's main function (its module holds the docstring and
      defines the flags).
    full: list every defined flag (`--helpfull`).

  Returns:
    The text to print.
  """
  module = sys.modules[main.__module__]
  doc = (module.__doc__ or '').strip()
  own = FLAGS.module_help(_module_name(main)).strip('\n').split('\n', 1)[-1]
  common_flags = ''.join(
      textwrap.fill(f'--[no]{name}: {FLAGS[name].help}', width=78,
                    initial_indent='  ', subsequent_indent='    ') + '\n'
      for name in ('quiet', 'verbose'))
  text = (f'{doc}\n\nFlags (`-` and `_` are the same in flag names):\n{own}\n'
          f'{common_flags}  --verbosity: absl logging level (-1 warning, 0 '
          'info, 1 debug).\n  --help / --helpfull: this page / every flag of '
          'every library.\n')
  if full:
    text += '\n' + FLAGS.get_help()
  return text


def _parse(argv: Sequence[str], main: Callable[..., int]) -> List[str]:
  argv = normalize_argv(argv, list(FLAGS))
  args = argv[1:argv.index('--')] if '--' in argv else argv[1:]
  wanted = [a for a in args if a in _HELP]
  if wanted:
    sys.stdout.write(help_text(main, full='--helpfull' in wanted))
    sys.exit(0)
  try:
    return FLAGS(argv)
  except flags.Error as e:
    program = sys.argv[0].rsplit('/', 1)[-1]
    print(f'error: {e}\nTry `{program} --help`.', file=sys.stderr)
    sys.exit(EXIT_BAD_INPUT)


class _AboveBars:
  """A stream for absl's handler: writes through `tqdm.write`.

  A log line written while a progress bar is drawn clears the bar, prints
  the line and redraws the bar below it.
  """

  def __init__(self, stream):
    self._stream = stream

  def write(self, text: str) -> None:
    tqdm.tqdm.write(text, file=self._stream, end='')

  def flush(self) -> None:
    self._stream.flush()

  def close(self) -> None:
    """Leaves the real stream open (absl closes its handler at exit)."""

  def isatty(self) -> bool:
    return self._stream.isatty()


# Python log lines of the libraries below that say nothing to a user of the
# binaries (shown with --verbose).
KNOWN_NOISE = (
    # TensorFlow's deprecation notices about its own internals.
    'is deprecated and will be removed in a future version',
    # tf_agents' Learner when its own checkpointing is off: the binaries
    # save the agent with the buffer (PairedCheckpointer).
    'checkpointing the training process is manually disabled',
    # ... and the Learner's look for checkpoints of its own (there are none:
    # <run_dir>/agent holds them).
    'No checkpoint available at',
    # tensorflow_datasets about the dtypes rlds itself declares.
    'You use TensorFlow DType',
)


class _DropNoise(std_logging.Filter):
  """Drops `KNOWN_NOISE` lines and portpicker's INFO line (at every Reverb
  server stop)."""

  def filter(self, record: std_logging.LogRecord) -> bool:
    if record.module == 'portpicker' and record.levelno < std_logging.WARNING:
      return False
    message = record.getMessage()
    return not any(noise in message for noise in KNOWN_NOISE)


def _set_up_logging() -> None:
  handler = logging.get_absl_handler()
  handler.python_handler.stream = _AboveBars(sys.stderr)
  if not FLAGS.verbose:
    handler.addFilter(_DropNoise())
    # TensorFlow's logger also prints through a handler of its own.
    std_logging.getLogger('tensorflow').addFilter(_DropNoise())
  if FLAGS.quiet and not FLAGS['verbosity'].present:
    # absl raised the default to INFO after parsing: --quiet lowers it.
    logging.set_verbosity(logging.WARNING)


def show_progress() -> bool:
  """Tells whether the binary should draw progress bars.

  Returns:
    True unless `--quiet`, when stderr is a terminal. Without a terminal
    (a log file, CI), long tasks log a progress line at intervals instead.
  """
  return not FLAGS.quiet and sys.stderr.isatty()


def parse_gin(files: Sequence[str], bindings: Sequence[str]) -> None:
  """Parses `--gin_file`s (by path or shipped name) and `--gin_bindings`.

  Args:
    files: paths, or names of shipped configs (see `configs.resolve`).
    bindings: gin binding strings.

  Raises:
    BadInput: a file is missing, or gin rejects a file or binding; the message
      names it and gin's reason in one line.
  """
  paths = []
  for name in files:
    try:
      paths.append(configs.resolve(name))
    except FileNotFoundError as e:
      raise BadInput(f'--gin_file={name!r}: {e}') from e
  try:
    gin.parse_config_files_and_bindings(paths, bindings)
  except Exception as e:  # pylint: disable=broad-except
    # Gin raises ValueError, KeyError, SyntaxError, tokenize.TokenError,
    # ImportError, ... for a bad file or binding: all are bad input.
    reason = ' '.join(str(e).split())
    raise BadInput(f'bad gin config ({type(e).__name__}): {reason}') from e


def run(main: Callable[[List[str]], Optional[int]]) -> None:
  """Runs a binary's `main(argv)` the way every smart_replay binary runs.

  Args:
    main: returns the exit code (None means 0); may raise `app.UsageError`
      (or `BadInput`) for bad input.

  Raises:
    SystemExit: always, with the exit code.
  """
  _define_common_flags()

  def wrapped(argv: List[str]) -> int:
    _set_up_logging()
    try:
      return main(argv) or 0
    except app.UsageError as e:
      if FLAGS.verbose:
        traceback.print_exc()
      program = sys.argv[0].rsplit('/', 1)[-1]
      print(f'error: {e}\nTry `{program} --help`.', file=sys.stderr)
      return EXIT_BAD_INPUT

  app.run(wrapped, flags_parser=lambda argv: _parse(argv, main))
