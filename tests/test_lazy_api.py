"""TensorFlow's API modules are stand-ins until used (runtime/lazy_api.py): what nobody uses is never imported,
and what is used is what TensorFlow's own modules give."""

import os
import subprocess

from helpers import BIN

# Run in a fresh interpreter: the import happens once per process.
PROBE = """
import inspect, sys
from hvd_mnist.runtime.lazy_api import ApiModuleOnUse
from hvd_mnist.runtime.startup import import_tensorflow_quietly
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
    probe = ("import sys; from hvd_mnist.runtime.startup import import_tensorflow_quietly; "
             "import_tensorflow_quietly(); import tensorflow as tf; from types import ModuleType; "
             "assert type(sys.modules['tensorflow._api.v2.signal']) is ModuleType; "
             "assert 'tensorflow.python.tpu.ops.gen_xla_ops' in sys.modules; print('ok')")
    result = subprocess.run([str(BIN / "python"), "-c", probe], capture_output=True, text=True, timeout=120,
                            env={**os.environ, "HVD_MNIST_LAZY_TF_API": "0"})
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-3000:]
