"""TC-WM: task-centric world models from visual foundations."""
