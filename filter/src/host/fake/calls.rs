//! The fake's answers to the glue's host calls: each counted by kind, failed when the test asks, and applied to
//! the in-memory state with Envoy's semantics (see the parent module).

use super::*;

impl Host for FakeHost {
    fn log(&self, level: LogLevel, message: &str) -> HostResult<()> {
        self.state().logs.push((level, message.to_string()));
        Ok(())
    }

    fn now_nanos(&self) -> HostResult<u64> {
        self.call(Kind::Time, "get_current_time")?;
        Ok(self.state().now_ns)
    }

    fn set_tick_period_ms(&self, period: u32) -> HostResult<()> {
        self.call(Kind::TickPeriod, "set_tick_period")?;
        self.state().tick_ms = Some(period);
        Ok(())
    }

    fn get_buffer(&self, buffer: BufferType, start: usize, max: usize) -> HostResult<Option<Vec<u8>>> {
        self.call(Kind::GetBuffer, "get_buffer")?;
        let s = self.state();
        let Some(b) = s.buffers.get(&buffer) else {
            return Ok(None);
        };
        let start = start.min(b.len());
        let end = start.saturating_add(max).min(b.len());
        Ok(Some(b[start..end].to_vec()))
    }

    fn set_buffer(&self, buffer: BufferType, start: usize, size: usize, value: &[u8]) -> HostResult<()> {
        self.call(Kind::SetBuffer, "set_buffer")?;
        let mut s = self.state();
        let b = s.buffers.entry(buffer).or_default();
        let start = start.min(b.len());
        let end = start.saturating_add(size).min(b.len());
        b.splice(start..end, value.iter().copied());
        Ok(())
    }

    fn get_map(&self, map: MapType) -> HostResult<Vec<(String, Vec<u8>)>> {
        self.call(Kind::GetMap, "get_map")?;
        Ok(self.state().maps.get(&map).cloned().unwrap_or_default())
    }

    fn get_map_value(&self, map: MapType, key: &str) -> HostResult<Option<Vec<u8>>> {
        self.call(Kind::GetMapValue, "get_map_value")?;
        let s = self.state();
        let pairs = s.maps.get(&map);
        Ok(pairs
            .and_then(|p| p.iter().find(|(n, _)| n == key))
            .map(|(_, v)| v.clone()))
    }

    fn set_map_value(&self, map: MapType, key: &str, value: Option<&str>) -> HostResult<()> {
        let name = if value.is_some() {
            "set_map_value"
        } else {
            "remove_map_value"
        };
        self.call(Kind::SetMapValue, name)?;
        let mut s = self.state();
        let pairs = s.maps.entry(map).or_default();
        pairs.retain(|(n, _)| n != key);
        if let Some(v) = value {
            pairs.push((key.to_string(), v.as_bytes().to_vec()));
        }
        Ok(())
    }

    fn get_property(&self, path: &[&str]) -> HostResult<Option<Vec<u8>>> {
        self.call(Kind::GetProperty, "get_property")?;
        Ok(self.state().properties.get(&path_key(path)).cloned())
    }

    fn set_property(&self, path: &[&str], value: &[u8]) -> HostResult<()> {
        self.call(Kind::SetProperty, "set_property")?;
        self.state().properties.insert(path_key(path), value.to_vec());
        Ok(())
    }

    fn get_shared_data(&self, key: &str) -> HostResult<(Option<Vec<u8>>, Option<u32>)> {
        self.call(Kind::GetShared, "get_shared_data")?;
        Ok(match self.state().shared.get(key) {
            Some((v, version)) => (Some(v.clone()), Some(*version)),
            None => (None, None),
        })
    }

    fn set_shared_data(&self, key: &str, value: &[u8], cas: Option<u32>) -> HostResult<()> {
        self.call(Kind::SetShared, "set_shared_data")?;
        let mut s = self.state();
        let raced = cas.is_some() && s.races.get(key).is_some_and(|n| *n > 0);
        if raced {
            if let Some(n) = s.races.get_mut(key) {
                *n -= 1;
            }
            if let Some((_, version)) = s.shared.get_mut(key) {
                *version = version.wrapping_add(1);
            }
        }
        let current = s.shared.get(key).map(|(_, v)| *v);
        if raced || cas.is_some_and(|c| Some(c) != current) {
            return Err(HostError {
                call: "set_shared_data",
                status: HostStatus::CasMismatch,
            });
        }
        let version = current.map_or(1, |v| v.wrapping_add(1));
        s.shared.insert(key.to_string(), (value.to_vec(), version));
        Ok(())
    }

    fn send_local_response(&self, status: u32, headers: &[(&str, &str)], body: &[u8]) -> HostResult<()> {
        self.call(Kind::LocalResponse, "send_local_response")?;
        let headers = headers.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let context = self.state().effective;
        self.state().replies.push(Reply {
            context,
            status,
            headers,
            body: body.to_vec(),
        });
        Ok(())
    }

    fn http_call(
        &self,
        cluster: &str,
        headers: &[(&str, &str)],
        body: Option<&[u8]>,
        timeout: Duration,
    ) -> HostResult<u32> {
        self.call(Kind::HttpCall, "http_call")?;
        let mut s = self.state();
        let token = u32::try_from(s.callouts.len()).unwrap_or(u32::MAX).saturating_add(1);
        s.callouts.push(Callout {
            token,
            cluster: cluster.to_string(),
            headers: headers.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            body: body.map(<[u8]>::to_vec),
            timeout,
        });
        Ok(token)
    }

    fn define_metric(&self, kind: MetricType, name: &str) -> HostResult<u32> {
        self.call(Kind::DefineMetric, "define_metric")?;
        let mut s = self.state();
        let at = match s.metrics.iter().position(|(_, n, _)| n == name) {
            Some(at) => at,
            None => {
                s.metrics.push((kind, name.to_string(), 0));
                s.metrics.len() - 1
            }
        };
        Ok(u32::try_from(at).unwrap_or(u32::MAX).saturating_add(1))
    }

    fn increment_metric(&self, id: u32, by: i64) -> HostResult<()> {
        self.call(Kind::IncrementMetric, "increment_metric")?;
        let mut s = self.state();
        let m = metric_at(&mut s, id)?;
        m.2 = m.2.saturating_add_signed(by);
        Ok(())
    }

    fn record_metric(&self, id: u32, value: u64) -> HostResult<()> {
        self.call(Kind::RecordMetric, "record_metric")?;
        let mut s = self.state();
        metric_at(&mut s, id)?.2 = value;
        Ok(())
    }

    fn get_metric(&self, id: u32) -> HostResult<u64> {
        self.call(Kind::GetMetric, "get_metric")?;
        let mut s = self.state();
        Ok(metric_at(&mut s, id)?.2)
    }

    fn set_effective_context(&self, context_id: u32) -> HostResult<()> {
        self.call(Kind::Effective, "set_effective_context")?;
        self.state().effective = Some(context_id);
        Ok(())
    }

    /// Recorded with the context made effective, never counted or failed (as the import below).
    fn resume_request(&self) -> HostResult<()> {
        let mut s = self.state();
        s.resumes += 1;
        let effective = s.effective;
        s.resumed.push(effective);
        Ok(())
    }
}

fn metric_at(s: &mut State, id: u32) -> HostResult<&mut (MetricType, String, u64)> {
    let at = usize::try_from(id).ok().and_then(|i| i.checked_sub(1));
    at.and_then(|i| s.metrics.get_mut(i)).ok_or(HostError {
        call: "metric",
        status: HostStatus::NotFound,
    })
}
