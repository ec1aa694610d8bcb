"""py_pytest: a py_test that runs its test file under pytest."""

def py_pytest(name, srcs, deps = [], data = [], args = [], size = "large", **kwargs):
    """One test file, run by pytest (tools/pytest/pytest_main.py).

    Args:
      name: the target name (the test file's name without .py).
      srcs: exactly one test file.
      deps: the project modules it imports (tools/bazel/build_deps.py).
      data: files it reads at run time; pytest.ini is always added.
      args: extra pytest arguments.
      size: Bazel's test size; "large" (15 min) by default: several files
        start servers and processes.
      **kwargs: other py_test attributes.
    """
    if len(srcs) != 1:
        fail("py_pytest takes exactly one test file, got %s" % srcs, "srcs")
    native.py_test(
        name = name,
        srcs = srcs + ["//tools/pytest:pytest_main.py"],
        main = "//tools/pytest:pytest_main.py",
        args = ["$(location %s)" % srcs[0]] + args,
        deps = deps,
        data = data + ["//:pytest.ini"],
        python_version = "PY3",
        size = size,
        srcs_version = "PY3",
        **kwargs
    )
