//! The filter's logging: the `log` crate's sink writes each line to a host's `log` call, and the panic hook logs
//! at critical level, both without unwrapping. The `log` facade is process-wide, so its sink is a plain function
//! given once, when the VM (or the native module) starts.

use proxy_wasm::types::LogLevel;

/// Where log lines go: a host's `log` call, errors ignored (there is nowhere else to report them).
pub type Sink = fn(LogLevel, &str);

/// The `log` crate's sink.
struct Logger(Sink);

impl log::Log for Logger {
    fn enabled(&self, metadata: &log::Metadata) -> bool {
        metadata.level() <= log::max_level()
    }

    fn log(&self, record: &log::Record) {
        if !self.enabled(record.metadata()) {
            return;
        }
        let level = match record.level() {
            log::Level::Trace => LogLevel::Trace,
            log::Level::Debug => LogLevel::Debug,
            log::Level::Info => LogLevel::Info,
            log::Level::Warn => LogLevel::Warn,
            log::Level::Error => LogLevel::Error,
        };
        (self.0)(level, &record.args().to_string());
    }

    fn flush(&self) {}
}

/// Installs the logger at `level`, writing to `sink`, and a panic hook that logs there at critical level. Once
/// per process: a later call changes nothing.
pub fn init_logging(level: log::LevelFilter, sink: Sink) {
    if log::set_logger(Box::leak(Box::new(Logger(sink)))).is_ok() {
        log::set_max_level(level);
    } else {
        return;
    }
    // Native tests keep the default hook's report too, or a failed assertion would only reach the host's log.
    #[cfg(test)]
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        sink(
            LogLevel::Critical,
            &format!("llmroute: panic, this worker's VM is lost: {info}"),
        );
        #[cfg(test)]
        previous(info);
    }));
}
