"""What the tests share (test modules import from here, never from each other): the server as a
process (server.py) or in this process (inprocess.py), what requests send (chat.py), /metrics
(metrics.py), tiny models with real chat templates (templates.py), scripted (scripted.py) or
tied (tied.py), fake KV on a real warm tier (fake_kv.py), hand-written warm folders
(warm_folders.py), Redis and HAProxy (services.py) and the dashboard's browser (browser.py)."""
