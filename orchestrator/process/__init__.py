"""Starting and always stopping engine server processes (whole process groups)."""
