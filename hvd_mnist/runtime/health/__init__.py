"""What tells a live rank from a lost one, and says why: heartbeats, the watchdog on collectives, dumps, stop
signals, memory limits."""
