"""hyperplex.experiments.state: a damaged record.json is named with its key, never a raw JSON error."""

import pytest


@pytest.mark.parametrize("text,match", [("{not json", r"not a record written by hyperplex \(invalid JSON"),
                                        ('{"status": "done", "healed": true}', r"key 'status' is 'done'"),
                                        ('{"status": "finished", "healed": "yes"}', r"key 'healed' is 'yes'"),
                                        ("[]", r"key 'status' is \[\]")])
def test_a_damaged_record_names_the_file_and_the_key(tmp_path, text, match):
    from hyperplex.experiments.state import RECORD_FILE, RecordError, read_record

    (tmp_path / RECORD_FILE).write_text(text)
    with pytest.raises(RecordError, match=rf"{RECORD_FILE}: {match}"):
        read_record(tmp_path)
    assert (tmp_path / RECORD_FILE).read_text() == text
