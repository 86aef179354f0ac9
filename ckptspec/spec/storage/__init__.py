"""The storage path: FileSystemWriterAsync, the state-dict saver and its metadata cache, Multi-Storage Client."""
