"""The soak test's short form: 30 s of mixed, partly hostile load on the demo model's server
(tests/soak.py; `make soak` runs five minutes)."""
import soak


def test_real_model_soak_30s(demo_gguf, capsys):
    code = soak.main(["--model", demo_gguf, "--duration", "30", "--clients", "16", "--max-rss-growth-mb", "64"])
    out = capsys.readouterr().out
    print(out)
    assert code == 0, out
