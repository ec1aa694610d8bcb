"""smart_replay: a Reverb replay buffer manager for TF-Agents."""

import setuptools

setuptools.setup(
    name='smart_replay',
    version='0.1.0',
    description=('A Reverb replay buffer for TF-Agents: built from the '
                 'collect_data_spec, validated, checkpointed and resumed safely.'),
    packages=(setuptools.find_packages(include=['smart_replay', 'smart_replay.*'])
              + ['smart_replay_scripts', 'smart_replay_benchmarks',
                 'smart_replay_configs']),
    # The absl binaries in scripts/ are installed as smart_replay_scripts, so
    # that console scripts and `python -m smart_replay_scripts.X` work; the
    # benchmark harness in benchmarks/ as smart_replay_benchmarks.
    # configs/*.gin as smart_replay_configs, found by name (apps/configs.py).
    package_dir={'smart_replay_scripts': 'scripts',
                 'smart_replay_benchmarks': 'benchmarks',
                 'smart_replay_configs': 'configs'},
    package_data={'smart_replay_configs': ['*.gin'],
                  # The zstd op's and the bind-address library's sources:
                  # built by the first process that needs them, into a
                  # per-user cache (smart_replay/ops/build.py).
                  'smart_replay.ops': ['*.cc', '*.c']},
    entry_points={'console_scripts': [
        'smart-replay-populate='
        'smart_replay_scripts.populate_starter_buffer:run',
        'smart-replay-demo=smart_replay_scripts.demo:run',
        'smart-replay-train=smart_replay_scripts.train:run',
        'smart-replay-serve=smart_replay_scripts.serve:run',
        'smart-replay-inspect=smart_replay_scripts.inspect_buffer:run',
        'smart-replay-import=smart_replay_scripts.import_buffer:run',
        'smart-replay-experiment=smart_replay_scripts.mixing_experiment:run',
    ]},
    # Reverb 0.14 ships wheels for CPython 3.9-3.11 only and imports distutils.
    python_requires='>=3.9,<3.12',
    install_requires=[
        'dm-reverb==0.14.0',
        'tensorflow==2.15.1',  # the only TensorFlow package; Reverb 0.14 needs ~=2.15
        'tf-agents==0.19.0',
        'tensorflow-probability==0.23.0',  # matches TF 2.15 and tf-agents 0.19
        'dm-tree',
        'absl-py',
        'gin-config',
        'grpcio',  # the control service of smart-replay-serve (TF needs it too)
        'cryptography',  # the control service's own TLS certificate
        'numpy<2',
        'tqdm',
        'prometheus-client',  # smart-replay-serve --metrics_port
        'cramjam',  # snappy: reading the chunks of Reverb checkpoint files
        'gymnasium==1.3.0',  # 'gymnasium:<id>' environments (apps/envs)
        # tf-agents imports gym 0.23 (suite_gym) on every run; these notices
        # leave out the "Gym has been unmaintained" banner it would print.
        'gym-notices==0.0.8',
    ],
    extras_require={
        'plots': ['matplotlib'],  # smart-replay-inspect --plot
        # Real RLDS/TFDS datasets (tools/rlds_io); tensorflow-metadata pinned:
        # newer ones need protobuf 5, which TF 2.15 does not take.
        'rlds': ['rlds==0.1.8', 'tensorflow-datasets==4.9.4',
                 'tensorflow-metadata==1.16.1'],
        # 'atari:<Game>' environments (apps/envs/atari_env.py): ale-py's wheels
        # ship the ROMs; Gymnasium's AtariPreprocessing needs cv2.
        'atari': ['ale-py==0.12.1', 'opencv-python-headless==4.10.0.84'],
        'bench': ['matplotlib', 'psutil'],  # benchmarks/: charts, server memory
        'test': ['pytest>=7', 'matplotlib', 'psutil'],
    },
)
