"""One thin file per subcommand: parse options, call one library function, print the output path."""
