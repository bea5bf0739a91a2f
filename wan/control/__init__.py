"""What steers the video: camera geometry (Plücker), presets and pictures of a path."""
