"""jetpipe serve with an audit hook on imports: the modules imported after the first frame was captured (a
module imported then holds a thread, and the GIL, in the middle of serving). Its jsonl sink must be
/tmp/s50/imp.jsonl (the first record's capture time is read from it).

  python late_imports.py serve --bundle DET --source synthetic://640x480@10 ... --sink jsonl:/tmp/s50/imp.jsonl
"""

import json
import sys
import time

events = []
sys.addaudithook(lambda event, args: events.append((time.time(), args[0])) if event == "import" else None)
sys.argv = ["jetpipe", *sys.argv[1:]]
from jetpipe.cli import main  # noqa: E402

try:
    main()
except SystemExit:
    pass
first = None
for line in open("/tmp/s50/imp.jsonl"):
    record = json.loads(line)
    if "t_result" in record:
        first = record["t_capture"]
        break
late = [(round(t - first, 3), module) for t, module in events if first and t > first]
print("first frame captured at", first, "imports after it:", len(late))
for row in late[:60]:
    print(row)
