from mlstack_doctor.cli import main

raise SystemExit(main())
