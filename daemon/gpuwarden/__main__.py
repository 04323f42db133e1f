from gpuwarden.cli.main import main

raise SystemExit(main())
