"""How a rank's process starts and ends: TensorFlow imported quietly (its API modules on use), native output
passed on, who a process is, a quick exit."""
