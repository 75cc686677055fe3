"""notify: the messages and the notifiers built for each channel (sending itself: tests/e2e/test_gate_outcomes.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from trainpipe.errors import GatesFailedError, MissingExtraError
from trainpipe.notifications.channels import (
    Message,
    PromotionNotification,
    TaskFailureNotification,
    notifier,
    notifiers,
)
from trainpipe.plan.model import NotifyChannel, NotifyPlan
from trainpipe.state.run_notes import NOTE_MAX_CHARS, merged_note

EMAIL = NotifyChannel(kind="email", conn_id="smtp_ops", to=("a@example.com", "b@example.com"),
                      from_email="trainpipe@example.com", events=("gate_failure", "task_failure"))
SLACK = NotifyChannel(kind="slack", conn_id="slack_ops", channel="#ml", events=("promotion",))


def test_email_notifier_sends_text_and_table_as_they_are_even_with_jinja_braces():
    from airflow.providers.smtp.notifications.smtp import SmtpNotifier

    message = Message(subject="gates {{ failed }}", text="line one\n\nerror: {{ x }} & <y>",
                      table_html="<table><tr><td>auc</td></tr></table>")
    smtp = notifier(EMAIL, message)

    assert isinstance(smtp, SmtpNotifier)
    assert (smtp.to, smtp.from_email, smtp.smtp_conn_id) == (["a@example.com", "b@example.com"],
                                                             "trainpipe@example.com", "smtp_ops")
    smtp.render_template_fields({})  # what the notifier does before sending
    assert smtp.subject == "gates {{ failed }}"
    assert smtp.html_content == ("<p>line one</p><p>error: {{ x }} &amp; &lt;y&gt;</p>"
                                 "<table><tr><td>auc</td></tr></table>")


def test_email_notifier_text_cannot_close_a_raw_block():
    """A `{% raw %}` wrapper (the earlier protection) is closed by `{%endraw%}` in the text, and what follows
    is rendered; with no template fields nothing is."""
    text = "model x{%endraw%}{{ 7 * 7 }}{%raw%}"
    smtp = notifier(EMAIL, Message(subject=text, text=text))
    smtp.render_template_fields({})
    assert smtp.subject == text and "49" not in smtp.html_content


def test_slack_channel_without_its_provider_names_the_install():
    with pytest.raises(MissingExtraError, match=r"notify.slack needs trainpipe's 'slack' extra .*: "
                                               r"pip install 'airflow-provider-trainpipe\[slack\]'"):
        notifier(SLACK, Message(subject="s", text="t"))


def test_only_the_channels_of_an_event_get_a_notifier():
    plan = NotifyPlan(channels=(EMAIL, SLACK))

    assert [n.smtp_conn_id for n in notifiers(plan, "gate_failure", Message(subject="s", text="t"))] == ["smtp_ops"]
    assert plan.for_event("approval") == ()


def test_slack_text_carries_the_table_in_a_code_block():
    assert Message(subject="S", text="T", table_text="a  b").as_slack() == "*S*\nT\n```\na  b\n```"


def test_slack_text_mentions_no_one_and_links_nowhere():
    """A trigger's conf quoted in a task failure ("force": "<!channel> ... <https://evil|Approve>") reached
    Slack as a channel-wide mention and a link showing other text than its address."""
    text = 'run conf: force: must be true or false, got "<!channel> re-approve at <https://evil.example|Airflow> & co"'
    sent = Message(subject="d <!here>", text=text, table_text="<@U123>").as_slack()
    assert "<" not in sent and ">" not in sent
    assert sent == ("*d &lt;!here&gt;*\nrun conf: force: must be true or false, got \"&lt;!channel&gt; re-approve at "
                    "&lt;https://evil.example|Airflow&gt; &amp; co\"\n```\n&lt;@U123&gt;\n```")


def _context(**values):
    ti = SimpleNamespace(dag_id="d", task_id="train", run_id="r1", try_number=2, log_url="http://airflow/log",
                         xcom_pull=lambda task_ids: values.get("xcom"))
    return {"ti": ti, "exception": values.get("exception")}


def test_task_failure_message_is_skipped_for_a_gate_failure_which_sent_its_own(monkeypatch):
    sent = []
    monkeypatch.setattr("trainpipe.notifications.channels.send",
                        lambda plan, event, message, context: sent.append((event, message)))
    callback = TaskFailureNotification(NotifyPlan(channels=(EMAIL,)))

    gate = RuntimeError("gate failed")
    gate.__cause__ = GatesFailedError("table")
    callback(_context(exception=gate))
    callback(_context(exception=RuntimeError("torchrun exited 1")))

    [(event, message)] = sent
    assert event == "task_failure"
    assert message.subject == "[trainpipe] d: task train failed"
    assert message.text == ("Task train of DAG d failed for good (try 2) in run r1.\n\nError: torchrun exited 1\n\n"
                            "Log: http://airflow/log")


def test_promotion_message_only_when_the_alias_moved(monkeypatch):
    sent = []
    monkeypatch.setattr("trainpipe.notifications.channels.send", lambda plan, event, message, context: sent.append(message))
    callback = PromotionNotification(NotifyPlan(channels=(SLACK,)))
    promotion = {"model_name": "m", "version": 4, "alias": "champion", "replaced_version": 3, "moved": True,
                 "reason": "gates passed (1/1)"}

    callback(_context(xcom={**promotion, "moved": False}))
    callback(_context(xcom=promotion))

    [message] = sent
    assert message.subject == "[trainpipe] d: m version 4 is now champion"
    assert message.text == "d: m version 4 is now champion (was: version 3), promoted by run r1.\n\nReason: gates passed (1/1)"


def test_run_note_keeps_a_persons_note_and_adds_each_line_once():
    assert merged_note(None, ["gates failed (1 of 2): ...; nothing registered"]) == \
        "gates failed (1 of 2): ...; nothing registered"
    assert merged_note("checked by ops", ["m version 2 approved by alice", "m version 2 approved by alice"]) == \
        "checked by ops\nm version 2 approved by alice"
    assert merged_note("x", []) == "x"
    # The reason first, whatever order the tasks left their lines in (train's cost line comes before promote's).
    assert merged_note(None, ["training used 0 GPU-hours, 0.01 CPU-hours over 1 try",
                              "promoted: m version 2 is champion; auc 0.9 vs 0.8 of version 1 (+0.1)"]) == \
        ("promoted: m version 2 is champion; auc 0.9 vs 0.8 of version 1 (+0.1)\n"
         "training used 0 GPU-hours, 0.01 CPU-hours over 1 try")
    long = merged_note(None, ["y" * 2000])
    assert len(long) == NOTE_MAX_CHARS and long.endswith("…")


def test_the_cost_line_states_the_training_throughput() -> None:
    from trainpipe.state.usage import RunUsage, usage_note

    usage = RunUsage(gpu_hours=0.0, cpu_hours=0.01, cost=None, tries=1)
    assert usage_note(usage, samples_per_second=24500.4) == \
        "training used 0 GPU-hours, 0.01 CPU-hours (no price table: no cost) over 1 try, at 24,500 samples/s"
    assert usage_note(usage) == "training used 0 GPU-hours, 0.01 CPU-hours (no price table: no cost) over 1 try"
