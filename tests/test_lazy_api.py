"""TensorFlow's API modules are stand-ins until used (runtime/boot/lazy_api.py): what nobody uses is never imported,
and what is used is what TensorFlow's own modules give; with them and the `typing` patch off (runtime/boot/startup.py's
fence), a run trains to the same weights."""

import os
import subprocess

from helpers import BIN, end_weights, read_metrics, run_trainer

# Run in a fresh interpreter: the import happens once per process.
PROBE = """
import inspect, sys
from hvd_mnist.runtime.boot.lazy_api import ApiModuleOnUse
from hvd_mnist.runtime.boot.startup import import_tensorflow_quietly
import_tensorflow_quietly()
import tensorflow as tf
unused = {"tensorflow.python.tpu.ops.gen_xla_ops", "tensorflow.lite.python.lite",
          "tensorflow.python.ops.signal.dct_ops"}
assert not unused & set(sys.modules), "imported at start-up: " + str(unused & set(sys.modules))
assert isinstance(tf.signal, ApiModuleOnUse) and isinstance(tf.raw_ops, ApiModuleOnUse)
inspect.getmodule(sys._getframe())  # asks every module for __file__, which a stand-in has

# A name that the API module imports is imported alone; one it lacks is missing without loading it.
assert tf.signal.fft(tf.constant([1, 2], tf.complex64)).numpy().tolist() == [3, -1]
assert int(tf.raw_ops.AddV2(x=tf.constant(2), y=tf.constant(3))) == 5
assert "tensorflow.python.tpu.ops.gen_xla_ops" not in sys.modules  # every raw op's module but AddV2's: unused
assert not hasattr(tf.signal, "no_such_op") and isinstance(tf.signal, ApiModuleOnUse)
assert tf.compat.v1.train.GradientDescentOptimizer.__name__ == "GradientDescentOptimizer"
assert tf.compat.v1.global_variables is tf.compat.v1.global_variables
assert tf.compat.v1.__version__ == tf.__version__  # a dunder that the module imports is a name like any other

# API modules imported later are stand-ins too: TensorBoard's summaries import all of tf.compat.v2.
from tensorboard.compat import tf2
assert tf2.summary.scalar and isinstance(sys.modules["tensorflow._api.v2.compat.v1"], ApiModuleOnUse)
assert "tensorflow.python.tpu.ops.gen_xla_ops" not in sys.modules

# Anything else loads the module, in its place; a stand-in kept by someone hands on to it.
kept = tf.signal
assert "fft" in dir(kept) and not isinstance(tf.signal, ApiModuleOnUse)
assert tf.signal is sys.modules["tensorflow._api.v2.signal"] and kept.ifft is tf.signal.ifft
assert tf.compat.v1.app.flags is tf.compat.v1.flags  # set by tf.compat.v1's own code: that loads it
# What tf.compat.v1's code set on the stand-in of its `nn` is on the real module once that loads.
rnn_cell = tf.compat.v1.nn.rnn_cell
assert "softmax" in dir(tf.compat.v1.nn) and tf.compat.v1.nn.rnn_cell is rnn_cell
# Threads that load one module at once all get it, and it is imported once.
import threading
kept, results = tf.strings, []
threads = [threading.Thread(target=lambda: results.append(dir(kept) and tf.strings)) for _ in range(8)]
[thread.start() for thread in threads]; [thread.join() for thread in threads]
assert len(results) == 8 and all(module is sys.modules["tensorflow._api.v2.strings"] for module in results)
assert not isinstance(tf.strings, ApiModuleOnUse)
from tensorflow import nest
assert nest.flatten({"a": [1, 2]}) == [1, 2]
import tensorflow._api.v2.linalg.experimental as linalg_experimental  # in a package not yet used, by path
assert tf.linalg.experimental is linalg_experimental

# TensorFlow's packages named as an API module: importing them leaves tf.distribute and tf.lite the API's.
import tensorflow.distribute.experimental.rpc.kernels.gen_rpc_ops, tensorflow.lite.python.lite_constants
assert tf.distribute.has_strategy() is False and tf.lite.TFLiteConverter
print("ok")
"""


def test_api_modules_load_on_first_use_and_only_then():
    result = subprocess.run([str(BIN / "python"), "-c", PROBE], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-3000:]


def test_the_stand_ins_can_be_turned_off():
    probe = ("import sys; from hvd_mnist.runtime.boot.startup import import_tensorflow_quietly; "
             "import_tensorflow_quietly(); import tensorflow as tf; from types import ModuleType; "
             "assert type(sys.modules['tensorflow._api.v2.signal']) is ModuleType; "
             "assert 'tensorflow.python.tpu.ops.gen_xla_ops' in sys.modules; print('ok')")
    result = subprocess.run([str(BIN / "python"), "-c", probe], capture_output=True, text=True, timeout=120,
                            env={**os.environ, "HVD_MNIST_LAZY_TF_API": "0"})
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-3000:]


def test_the_hooks_are_off_for_a_tensorflow_they_were_not_tested_with():
    """The fence can fail: another TensorFlow version is imported as TensorFlow does, and one debug line says so."""
    probe = ("import logging, sys; from types import ModuleType; from hvd_mnist.runtime.boot import startup; "
             "logging.basicConfig(level=logging.DEBUG, format='%(levelname)s %(message)s'); "
             "assert startup.hooks_on(); startup.HOOKS_TESTED_WITH = ('2.0.0',); startup.import_tensorflow_quietly(); "
             "assert type(sys.modules['tensorflow._api.v2.signal']) is ModuleType; print('ok')")
    result = subprocess.run([str(BIN / "python"), "-c", probe], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-3000:]
    said = [line for line in result.stderr.splitlines() if "start-up hooks" in line]
    assert len(said) == 1 and said[0].startswith("DEBUG start-up hooks off: TensorFlow 2.")
    assert said[0].endswith(", tested with 2.0.0 only"), said


def test_a_run_with_the_hooks_off_trains_to_the_same_weights_and_accuracy(tmp_path):
    """The hooks change how TensorFlow is imported, nothing it computes: off, a run ends as it does with them on."""
    ends = []
    for hooks in ("1", "0"):
        run_dir = tmp_path / f"hooks-{hooks}"
        run_trainer("gloo", 2, "--steps", "40", "--output-dir", str(run_dir),
                    extra_env={"HVD_MNIST_LAZY_TF_API": hooks})
        ends.append((end_weights(run_dir), read_metrics(run_dir)[-1]["test_accuracy"]))
    assert ends[0] == ends[1] and len(set(ends[0][0])) == 1, ends
