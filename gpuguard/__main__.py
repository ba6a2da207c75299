from gpuguard.entry import main

main()
