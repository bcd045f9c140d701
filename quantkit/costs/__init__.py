"""What a command will cost before it runs (`--plan`): pure cost formulas and the wiring that
feeds them a command's inputs."""
