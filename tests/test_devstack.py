"""devstack's own judgement of a service that exited as it started (the emulators' logs, read as they are written)."""
from devstack import services


def test_an_emulator_whose_port_was_taken_is_started_again_though_its_log_ends_in_a_stack_trace(tmp_path):
    """A Java emulator that lost its port between free_port() and its bind logs `BindException: Address already in
    use` and then a stack trace longer than the tail an error shows: it is still PortTaken (a new port is tried), and
    any other exit is not."""
    log = tmp_path / "emulator.log"
    log.write_text("Executing: cloud-firestore-emulator\njava.net.BindException: Address already in use\n"
                   + "".join(f"\tat io.netty.Frame{i}(Frame.java:{i})\n" for i in range(40)))
    shown = services._log_tail(log)
    assert "Address already in use" not in shown  # the tail alone would not say so
    taken = services._exited_at_start("Firestore emulator", 35161, shown, whole=services._log_tail(log, lines=None))
    assert isinstance(taken, services.PortTaken) and "Frame39" in str(taken)
    log.write_text("Exception in thread main: java.lang.UnsupportedClassVersionError\n" * 30)
    other = services._exited_at_start("Firestore emulator", 35161, services._log_tail(log),
                                      whole=services._log_tail(log, lines=None))
    assert type(other) is services.DevstackError
    assert isinstance(services._exited_at_start("memcached", 1, "failed to listen: Address already in use"),
                      services.PortTaken)
