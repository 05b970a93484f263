from modelshrink.cli import main

main()
