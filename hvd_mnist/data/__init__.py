"""MNIST data: IDX files, the offline fallback, TFRecords and the tf.data input pipeline."""
