"""`--plan`: pure cost functions and the wiring that feeds them a command's inputs."""
