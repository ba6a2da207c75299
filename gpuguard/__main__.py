from gpuguard.cli.entry import main

main()
