"""Running a sweep's trials on Ray: queue order, placement by GPU demand, cancel, resume."""
