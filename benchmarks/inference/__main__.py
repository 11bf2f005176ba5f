from benchmarks.inference.run import main

raise SystemExit(main())
